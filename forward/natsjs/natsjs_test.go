package natsjs

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/forward/forwardtest"
	"github.com/devicegate/devicegate/internal/natstest"
	"github.com/devicegate/devicegate/internal/poll"
)

// stored returns the payloads the stream holds for each device, in
// stream order, checking each message's subject and headers.
func stored(t *testing.T, st jetstream.Stream) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, m := range messages(t, st) {
		d := m.Header.Get("device")
		if m.Subject != "devices."+d+".t" || m.Header.Get("topic") != "devices/"+d+"/t" || m.Header.Get("qos") != "1" ||
			m.Header.Get("at") == "" || !strings.HasPrefix(m.Header.Get(jetstream.MsgIDHeader), "streams/0/") {
			t.Fatalf("message %d: subject %q, headers %v", m.Sequence, m.Subject, m.Header)
		}
		out[d] = append(out[d], string(m.Data))
	}
	return out
}

// messages returns what the stream holds, in order.
func messages(t *testing.T, st jetstream.Stream) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// TestForwardToJetStream: messages of three devices reach a real
// nats-server's stream on subjects made from their topics, with their
// headers, in order; through an outage (the server killed, then
// restarted on its store) they wait in the log and are stored after it;
// the stream holds every message exactly once.
func TestForwardToJetStream(t *testing.T) {
	srv := natstest.Start(t)
	stream := srv.CreateStream("DEVICES", "devices.>")
	f, st := forwardtest.Run(t, "streams/0", &Dialer{URLs: srv.URL})
	devices := []string{"meter-1", "meter-2", "meter-3"}
	n := forwardtest.Outages(t, f, st, "streams/0", devices, forwardtest.Outage{Name: "a restart", Down: srv.Kill, Up: srv.Restart})
	got := stored(t, stream)
	for _, d := range devices {
		if dups := forwardtest.InOrder(t, d, got[d], n); dups != 0 {
			t.Fatalf("%s: %d duplicates in the stream", d, dups)
		}
	}
}

// TestDuplicateStoredOnce: a message sent again with the same ID (as
// after a crash) is stored once; another message is stored.
func TestDuplicateStoredOnce(t *testing.T) {
	srv := natstest.Start(t)
	stream := srv.CreateStream("DEVICES", "devices.>")
	c, err := (&Dialer{URLs: srv.URL}).Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := forward.Message{Device: "meter-1", Topic: "devices/meter-1/t", QoS: 1, Payload: []byte("1"), ID: "streams/0/1", At: time.Now()}
	for range 2 {
		wait(t, c.Send(&m, 1))
	}
	m.ID, m.Payload = "streams/0/2", []byte("2")
	wait(t, c.Send(&m, 1))
	if got := stored(t, stream)["meter-1"]; strings.Join(got, ",") != "1,2" {
		t.Fatalf("stream holds %v, want [1 2]", got)
	}
}

func wait(t *testing.T, a forward.Ack) {
	t.Helper()
	select {
	case <-a.Done():
		if err := a.Error(); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no acknowledgement in 10s")
	}
}

// TestNoStream: a subject no stream holds fails with an error that says
// so, and the forwarder keeps the message and reports the error.
func TestNoStream(t *testing.T) {
	srv := natstest.Start(t)
	f, st := forwardtest.Run(t, "streams/0", &Dialer{URLs: srv.URL, Subject: "elsewhere.{device}"})
	forwardtest.Append(t, f, []string{"meter-1"}, 1, 1)
	poll.Until(t, 20*time.Second, "the failure reported", func() bool {
		return strings.Contains(f.Stats().LastError, "no JetStream stream holds the subject")
	})
	if n := forwardtest.Backlog(t, st, "streams/0"); n != 1 {
		t.Fatalf("backlog %d, want the message kept", n)
	}
}

// TestSubject: topics and devices become valid subject tokens.
func TestSubject(t *testing.T) {
	for _, c := range []struct{ tmpl, topic, device, want string }{
		{"", "devices/m1/t", "m1", "devices.m1.t"},
		{"fleet.{device}.{topic}", "a/b", "m.1", "fleet.m_1.a.b"},
		{"", "/a//b.c/ *>", "d", "_.a._.b_c.___"},
		{"x.{device}", "t", "a/b c", "x.a_b_c"},
	} {
		if got := Subject(c.tmpl, c.topic, c.device); got != c.want {
			t.Errorf("Subject(%q, %q, %q) = %q, want %q", c.tmpl, c.topic, c.device, got, c.want)
		}
	}
}

// BenchmarkSubject is the subject of each message sent (the template
// parsed once, at Dial).
func BenchmarkSubject(b *testing.B) {
	tmpl := forward.ParseTemplate("fleet.{topic}", "{topic}")
	b.ReportAllocs()
	for range b.N {
		_ = tmpl.Expand("devices/meter-0042/telemetry", "meter-0042", tokens)
	}
}

// TestRefusedForGood: a stream that takes messages of at most 1 KiB
// (max_msg_size) and one device whose messages are larger: JetStream
// refuses them (message size exceeds maximum allowed). They go to the
// dead-letter log, counted; every other device's message is stored
// once, in order; once the stream takes them, a replay stores them.
func TestRefusedForGood(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	js := srv.JetStream()
	cfg := jetstream.StreamConfig{Name: "DEVICES", Subjects: []string{"devices.>"}, Storage: jetstream.FileStorage, MaxMsgSize: 1024}
	stream, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f, st := forwardtest.Run(t, "streams/0", &Dialer{URLs: srv.URL})
	var good []string
	for i := range 19 {
		good = append(good, "dev-"+strconv.Itoa(i))
	}
	forwardtest.Refused(t, f, st, "streams/0", 30, forwardtest.Refusal{Good: good, Bad: "bad", Reason: "too_large",
		Payload: func(d string, i int) []byte {
			p := []byte(strconv.Itoa(i))
			if d == "bad" {
				p = append(p, make([]byte, 2000)...)
			}
			return p
		},
		Number: func(p string) string { return strings.TrimRight(p, "\x00") },
		Fix: func() {
			cfg.MaxMsgSize = -1
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
		},
		Read: func(d string) []string {
			var out []string
			for _, m := range messages(t, stream) {
				if m.Header.Get("device") == d {
					out = append(out, string(m.Data))
				}
			}
			return out
		},
		ReadIDs: func(d string) []string {
			var ids []string
			for _, m := range messages(t, stream) {
				if m.Header.Get("device") == d {
					ids = append(ids, m.Header.Get(nats.MsgIdHdr))
				}
			}
			return ids
		}})
}

// TestStreamCreatedMidRun: one device's 60 messages appended before
// the stream of their subject exists; it is created while the
// forwarder is failing to publish them (no responders). The stream
// then holds the 60, in order, each once: before, a window of
// publishes in flight had its first ones fail and later ones stored,
// and the first ones, sent again, were stored after them (m24 m1 m2 …
// m23 m29 m25 …). With dead_after_closes 1, nothing is set aside.
func TestStreamCreatedMidRun(t *testing.T) {
	for run := range 3 {
		srv := natstest.Start(t)
		// dead_after_closes at its strictest: a publish no stream
		// answers is a failure, not a close, and sets nothing aside.
		f, st := forwardtest.RunWith(t, "streams/0", &Dialer{URLs: srv.URL}, func(c *forward.Config) { c.DeadAfterCloses = 1 })
		forwardtest.Append(t, f, []string{"meter-1"}, 1, 60)
		poll.Until(t, 10*time.Second, "publishes failing", func() bool { return f.Attempts() >= 3 })
		stream := srv.CreateStream("DEVICES", "devices.>")
		poll.Until(t, 20*time.Second, "the log sent", func() bool { return forwardtest.Backlog(t, st, "streams/0") == 0 })
		got := stored(t, stream)["meter-1"]
		if dups := forwardtest.InOrder(t, "meter-1", got, 60); dups != 0 {
			t.Fatalf("run %d: %d duplicates", run, dups)
		}
		if len(got) != 60 {
			t.Fatalf("run %d: %d messages stored, want 60", run, len(got))
		}
	}
}
