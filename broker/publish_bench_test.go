package broker

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// BenchmarkOnPublishRefused is the refusal path by protocol version and
// QoS (BenchmarkOnPublishDropped is MQTT 5, QoS 0): only an MQTT 5
// publisher with QoS > 0 gets a reason string; the others cost no more
// than the decision and a counter. The client has no connection, so the
// ack the hook writes is built but not sent.
//
//	go test -run '^$' -bench OnPublish -benchmem ./broker/
func BenchmarkOnPublishRefused(b *testing.B) {
	for _, c := range []struct {
		name         string
		version, qos byte
	}{{"v3/qos0", 4, 0}, {"v3/qos1", 4, 1}, {"v5/qos1", 5, 1}} {
		b.Run(c.name, func(b *testing.B) {
			s, cl, pk := newHookClient(b, devicelimit.Quota{Limit: 1, Window: time.Second, Feedback: quiet})
			cl.Properties.ProtocolVersion = c.version
			pk.FixedHeader.Qos = c.qos
			b.ReportAllocs()
			for b.Loop() {
				_, _ = s.hook.OnPublish(cl, pk)
			}
		})
	}
}

// BenchmarkOnPublishFeedback is an admitted MQTT 5 QoS 1 publish by
// feedback mode: off (BenchmarkOnPublishAllowed's path), the default
// (below 25 %: the standing is read, nothing sent while the window has
// room) and always (read and formatted, left for the PUBACK's encode);
// and a refusal under always.
func BenchmarkOnPublishFeedback(b *testing.B) {
	for _, c := range []struct {
		name  string
		fb    devicelimit.Feedback
		limit int
	}{
		{"off", quiet, devicelimit.MaxLimit},
		{"default", devicelimit.Feedback{}, devicelimit.MaxLimit},
		{"always", devicelimit.Feedback{Mode: devicelimit.FeedbackAlways}, devicelimit.MaxLimit},
		{"always-refused", devicelimit.Feedback{Mode: devicelimit.FeedbackAlways}, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, cl, pk := newHookClient(b, devicelimit.Quota{Limit: c.limit, Window: time.Second, Feedback: c.fb})
			b.ReportAllocs()
			for b.Loop() {
				_, _ = s.hook.OnPublish(cl, pk)
			}
		})
	}
}
