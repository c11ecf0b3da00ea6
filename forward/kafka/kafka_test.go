package kafka

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/forward/forwardtest"
	"github.com/devicegate/devicegate/internal/kafkatest"
	"github.com/devicegate/devicegate/internal/poll"
)

// byDevice returns the values of recs per device (the record key), in
// order, checking each record's headers and that a device's records
// share one partition.
func byDevice(t *testing.T, recs []*kgo.Record) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	part := map[string]int32{}
	for _, r := range recs {
		d := string(r.Key)
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		if h["device"] != d || h["topic"] != "devices/"+d+"/t" || h["qos"] != "1" || h["at"] == "" || h["id"] == "" {
			t.Fatalf("record %s/%d@%d: key %q, headers %v", r.Topic, r.Partition, r.Offset, d, h)
		}
		if p, ok := part[d]; ok && p != r.Partition {
			t.Fatalf("%s: records in partitions %d and %d", d, p, r.Partition)
		}
		part[d] = r.Partition
		out[d] = append(out[d], string(r.Value))
	}
	return out
}

// TestForwardToKafka: messages of three devices reach a Kafka topic
// (franz-go's kfake: no Kafka broker can be installed here) keyed by
// device, with their headers, each device in one partition and in
// order; through an outage (the broker closed, then restarted on its
// data) they wait in the log and are produced after it, in order.
func TestForwardToKafka(t *testing.T) {
	k := kafkatest.Start(t, 3, []string{"telemetry"})
	f, st := forwardtest.Run(t, "streams/0", &Dialer{Seeds: []string{k.Addr}, Topic: "telemetry"})
	devices := []string{"meter-1", "meter-2", "meter-3"}
	n := forwardtest.Outages(t, f, st, "streams/0", devices, forwardtest.Outage{Name: "a restart", Down: k.Close, Up: k.Restart})
	got := byDevice(t, k.Records("telemetry"))
	for _, d := range devices {
		dups := forwardtest.InOrder(t, d, got[d], n)
		t.Logf("%s: %d records in order, %d duplicates", d, n, dups)
	}
}

// TestSASLAndTopicTemplate: a broker that requires SCRAM-SHA-256 takes
// records from a producer with the right account, into the topic the
// template names; a wrong password fails at dial with the reason.
func TestSASLAndTopicTemplate(t *testing.T) {
	k := kafkatest.Start(t, 1, []string{"fleet.meter-1"}, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "gw", "secret"))
	auth := func(pass string) kgo.Opt {
		return kgo.SASL(scram.Auth{User: "gw", Pass: pass}.AsSha256Mechanism())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := (&Dialer{Seeds: []string{k.Addr}, Topic: "fleet.{device}", Options: []kgo.Opt{auth("wrong")}}).Dial(ctx); err == nil {
		t.Fatal("a wrong password connected")
	} else {
		t.Logf("wrong password: %v", err)
	}
	c, err := (&Dialer{Seeds: []string{k.Addr}, Topic: "fleet.{device}", Options: []kgo.Opt{auth("secret")}}).Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 1; i <= 3; i++ {
		a := c.Send(&forward.Message{Device: "meter-1", Topic: "devices/meter-1/t", QoS: 1, Payload: []byte(strconv.Itoa(i)), ID: "x/" + strconv.Itoa(i), At: time.Now()}, 1)
		<-a.Done()
		if err := a.Error(); err != nil {
			t.Fatal(err)
		}
	}
	if got := byDevice(t, k.Records("fleet.meter-1", auth("secret")))["meter-1"]; len(got) != 3 || got[2] != "3" {
		t.Fatalf("fleet.meter-1 holds %v", got)
	}
}

// TestOldMessagesProduced: a message accepted long ago (a backlog after
// an outage) is produced with its acceptance time as the record's
// timestamp. franz-go measures a record delivery timeout from that
// timestamp: with one of 30 s, every message older than that failed at
// once, "records have timed out before they were able to be produced",
// and a backlog older than 30 s never drained.
func TestOldMessagesProduced(t *testing.T) {
	k := kafkatest.Start(t, 1, []string{"telemetry"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := (&Dialer{Seeds: []string{k.Addr}, Topic: "telemetry"}).Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	at := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	a := c.Send(&forward.Message{Device: "meter-1", Topic: "devices/meter-1/t", QoS: 1, Payload: []byte("1"), ID: "x/1", At: at}, 1)
	select {
	case <-a.Done():
	case <-ctx.Done():
		t.Fatal("no acknowledgement in 10 s")
	}
	if err := a.Error(); err != nil {
		t.Fatalf("a message accepted an hour ago: %v", err)
	}
	recs := k.Records("telemetry")
	if len(recs) != 1 || !recs[0].Timestamp.Equal(at) {
		t.Fatalf("records %v, want one stamped %v", recs, at)
	}
}

// TestTopicName: MQTT topics and devices become topic-name characters.
func TestTopicName(t *testing.T) {
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'a'
	}
	for _, c := range []struct{ tmpl, topic, device, want string }{
		{"telemetry", "devices/m1/t", "m1", "telemetry"},
		{"{topic}", "devices/m1/t", "m1", "devices.m1.t"},
		{"fleet-{device}", "t", "m 1/ü", "fleet-m_1___"}, // ü is two bytes
		{"{device}", "t", string(long), string(long[:249])},
	} {
		if got := TopicName(c.tmpl, c.topic, c.device); got != c.want {
			t.Errorf("TopicName(%q, %q, %q) = %q, want %q", c.tmpl, c.topic, c.device, got, c.want)
		}
	}
}

// TestSilentUpstreamNotConnected: a broker that takes the connection and
// answers everything but produce requests is not "connected" in the
// forwarder's state once nothing was acknowledged for the
// acknowledgement timeout, and the reason says so; once it answers
// again, it is.
func TestSilentUpstreamNotConnected(t *testing.T) {
	k := kafkatest.Start(t, 1, []string{"telemetry"})
	silent := make(chan struct{})
	k.Control(kmsg.Produce, func(kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case <-silent:
			return nil, nil, false // answered again
		default:
			k.KeepControl()
			return nil, nil, true // never answered
		}
	})
	f, st := forwardtest.Run(t, "streams/0", &Dialer{Seeds: []string{k.Addr}, Topic: "telemetry"})
	forwardtest.Append(t, f, []string{"meter-1"}, 1, 5)
	poll.Until(t, 20*time.Second, "the silence reported", func() bool {
		s := f.Stats()
		return s.Connected == 0 && strings.Contains(s.LastError, "nothing acknowledged")
	})
	t.Logf("while silent: %q", f.Stats().LastError)
	close(silent)
	poll.Until(t, 20*time.Second, "the backlog delivered", func() bool { return forwardtest.Backlog(t, st, "streams/0") == 0 })
	if s := f.Stats(); s.Connected != 1 || s.LastError != "" {
		t.Fatalf("answering again: %+v", s)
	}
}

// TestRefusedForGood: a topic that takes messages of at most 4 KiB
// (max.message.bytes) and one device whose messages are larger: each
// batch of them is refused with MESSAGE_TOO_LARGE. They go to the
// dead-letter log, counted; every other device's message is stored
// once, in order (the devices' keys put bad alone in its partition:
// a batch refused holds only its records); once the limit is raised, a
// replay stores them.
func TestRefusedForGood(t *testing.T) {
	k := kafkatest.Start(t, 3, []string{"telemetry"})
	k.SetTopicConfig("telemetry", "max.message.bytes", "4096")
	f, st := forwardtest.Run(t, "streams/0", &Dialer{Seeds: []string{k.Addr}, Topic: "telemetry"})
	bad := "bad"
	var good []string
	for i := 0; len(good) < 19; i++ {
		// Devices whose records go to other partitions than bad's.
		if d := "dev-" + strconv.Itoa(i); partition(d, 3) != partition(bad, 3) {
			good = append(good, d)
		}
	}
	forwardtest.Refused(t, f, st, "streams/0", 30, forwardtest.Refusal{Good: good, Bad: bad, Reason: "too_large",
		Payload: func(dev string, i int) []byte {
			p := []byte(strconv.Itoa(i))
			if dev == bad {
				// Random bytes: the producer compresses its batches.
				p = append(p, ':')
				p = append(p, make([]byte, 8000)...)
				rand.Read(p[len(p)-8000:])
			}
			return p
		},
		Number: func(p string) string { n, _, _ := strings.Cut(p, ":"); return n },
		Fix:    func() { k.SetTopicConfig("telemetry", "max.message.bytes", "1048588") },
		Read: func(dev string) []string {
			var out []string
			for _, r := range k.Records("telemetry") {
				if string(r.Key) == dev {
					out = append(out, string(r.Value))
				}
			}
			return out
		},
		ReadIDs: func(dev string) []string {
			var ids []string
			for _, r := range k.Records("telemetry") {
				if string(r.Key) != dev {
					continue
				}
				for _, h := range r.Headers {
					if h.Key == "id" {
						ids = append(ids, string(h.Value))
					}
				}
			}
			return ids
		}})
}

// partition is the partition, of n, franz-go's default partitioner
// gives a record keyed key (murmur2, as Kafka's Java client).
func partition(key string, n int) int {
	return int(kgo.StickyKeyPartitioner(nil).ForTopic("t").Partition(&kgo.Record{Key: []byte(key)}, n))
}
