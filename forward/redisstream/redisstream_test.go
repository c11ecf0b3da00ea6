package redisstream

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/forward/forwardtest"
	"github.com/devicegate/devicegate/internal/poll"
)

// entries returns the payloads of stream s, in stream order, checking
// the fields of each entry, and that a payload seen twice (a duplicate)
// carries the same id both times.
func entries(t *testing.T, c *redis.Client, s, device string) []string {
	t.Helper()
	msgs, err := c.XRange(context.Background(), s, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ids := map[string]string{}
	for _, m := range msgs {
		p, id := m.Values["payload"].(string), m.Values["id"].(string)
		if first, ok := ids[p]; ok && first != id {
			t.Fatalf("%s: payload %s sent twice with ids %s and %s", s, p, first, id)
		}
		ids[p] = id
		if m.Values["device"] != device || m.Values["topic"] != "devices/"+device+"/t" || m.Values["qos"] != "1" || m.Values["at"] == "" ||
			!strings.HasPrefix(m.Values["id"].(string), "streams/0/") {
			t.Fatalf("entry %s of %s: fields %v", m.ID, s, m.Values)
		}
		out = append(out, m.Values["payload"].(string))
	}
	return out
}

// TestForwardToRedisStreams: messages of three devices reach a real
// redis-server, each in the stream its template names, with topic,
// device, time and QoS fields, in the order appended; through an outage
// (Redis paused) and a restart (Redis killed, and started again on its
// append-only file) they wait in the log and arrive after it, in order,
// duplicates only from what was in flight; MAXLEN ~ bounds a stream.
func TestForwardToRedisStreams(t *testing.T) {
	srv := redistest.StartDurable(t)
	f, st := forwardtest.Run(t, "streams/0", &Dialer{Options: &redis.Options{Addr: srv.Addr}, Stream: "telemetry:{device}"})
	devices := []string{"meter-1", "meter-2", "meter-3"}
	c := srv.Client()
	n := forwardtest.Outages(t, f, st, "streams/0", devices,
		forwardtest.Outage{Name: "a pause", Down: srv.Stop, Up: srv.Cont}, forwardtest.Outage{Name: "a restart", Down: srv.Kill, Up: srv.Restart})
	for _, d := range devices {
		// Duplicates come from what was in flight, with the same id
		// (entries checks).
		dups := forwardtest.InOrder(t, d, entries(t, c, "telemetry:"+d, d), n)
		t.Logf("%s: %d messages in order, %d duplicates", d, n, dups)
	}

	g, _ := forwardtest.Run(t, "bounded/0", &Dialer{Options: &redis.Options{Addr: srv.Addr}, Stream: "bounded", MaxLen: 10})
	for i := range 500 {
		if err := g.Append(&forward.Message{Device: "d", Topic: "t", QoS: 1, Payload: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 20*time.Second, "the bounded stream written", func() bool { return g.Stats().Backlog == 0 })
	if n, err := c.XLen(context.Background(), "bounded").Result(); err != nil || n >= 500 || n < 10 {
		t.Fatalf("XLEN bounded = %d, %v; want about 10 (MAXLEN ~ trims whole nodes)", n, err)
	}
}

// TestRefusedForGood: a key of the wrong type at one device's stream
// (SET devices/bad/t x): Redis refuses that device's XADDs with
// WRONGTYPE while it runs the others of the same pipelines. The
// refused messages go to the dead-letter log, counted; every other
// message is stored once, in order (before, the pipeline's failure
// ended the connection and everything was sent again, forever); once
// the key is deleted, a replay delivers them.
func TestRefusedForGood(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "devices/bad/t", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	f, st := forwardtest.Run(t, "streams/0", &Dialer{Options: &redis.Options{Addr: srv.Addr}})
	var good []string
	for i := range 19 {
		good = append(good, "dev-"+strconv.Itoa(i))
	}
	forwardtest.Refused(t, f, st, "streams/0", 30, forwardtest.Refusal{Good: good, Bad: "bad", Reason: "wrong_type",
		Fix: func() { c.Del(ctx, "devices/bad/t") },
		Read: func(d string) []string {
			if typ, _ := c.Type(ctx, "devices/"+d+"/t").Result(); typ != "stream" {
				return nil
			}
			return entries(t, c, "devices/"+d+"/t", d)
		},
		ReadIDs: func(d string) []string {
			msgs, err := c.XRange(ctx, "devices/"+d+"/t", "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range msgs {
				ids = append(ids, m.Values["id"].(string))
			}
			return ids
		}})
}
