package redisstream

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"devicegate/cluster/redistest"
	"devicegate/forward"
	"devicegate/internal/poll"
	"devicegate/persist"
)

func run(t *testing.T, d *Dialer) (*forward.Forwarder, *persist.Store) {
	t.Helper()
	st, err := persist.Open(t.TempDir(), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f, err := forward.New(forward.Config{Name: "streams/0", Dial: d, MaxQoS: 1, AckTimeout: time.Second,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f, st
}

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
// (Redis paused) they wait in the log and arrive after it, in order,
// duplicates only from what was in flight; MAXLEN ~ bounds a stream.
func TestForwardToRedisStreams(t *testing.T) {
	srv := redistest.Start(t)
	f, st := run(t, &Dialer{Options: &redis.Options{Addr: srv.Addr}, Stream: "telemetry:{device}"})
	devices := []string{"meter-1", "meter-2", "meter-3"}
	appendN := func(from, to int) {
		for i := from; i <= to; i++ {
			for _, d := range devices {
				if err := f.Append(&forward.Message{Device: d, Topic: "devices/" + d + "/t", QoS: 1, Payload: []byte(strconv.Itoa(i))}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	backlog := func() int {
		n, _, _, _, err := st.ForwardStats("streams/0")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	c := srv.Client()
	appendN(1, 100)
	poll.Until(t, 20*time.Second, "the log sent", func() bool { return backlog() == 0 })
	srv.Stop()
	appendN(101, 200)
	poll.Until(t, 20*time.Second, "the outage noticed", func() bool { return !f.Connected() })
	if n := backlog(); n == 0 {
		t.Fatal("nothing waited in the log during the outage")
	}
	srv.Cont()
	poll.Until(t, 30*time.Second, "the backlog sent", func() bool { return backlog() == 0 })
	for _, d := range devices {
		got := entries(t, c, "telemetry:"+d, d)
		seen := map[string]bool{}
		next := 1
		for _, p := range got {
			if seen[p] {
				continue // a duplicate, from what was in flight (same id: entries checks)
			}
			seen[p] = true
			if p != strconv.Itoa(next) {
				t.Fatalf("%s: entry %q where %d was due: out of order or missing", d, p, next)
			}
			next++
		}
		if next != 201 {
			t.Fatalf("%s: %d distinct entries, want 200", d, next-1)
		}
		t.Logf("%s: 200 messages in order, %d duplicates", d, len(got)-200)
	}

	g, _ := run(t, &Dialer{Options: &redis.Options{Addr: srv.Addr}, Stream: "bounded", MaxLen: 10})
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
