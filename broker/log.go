package broker

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

var discardLogger = slog.New(slog.DiscardHandler)

// mochiLogWindow is how often one kind of client-triggered line from
// mochi may be logged; the lines it holds back are counted in the next
// one's "suppressed".
const mochiLogWindow = 10 * time.Second

// mochiHandler is the slog handler given to mochi, which logs some
// events per packet and with the whole packet in them. It keeps what an
// operator needs, one short line per kind of event per mochiLogWindow:
//   - "publish packet rejected" and "packet rejected" (Debug, per
//     refused publish, with payload) are dropped: the throttle hook logs
//     refusals once per window.
//   - mochi's keepalive warning (at CONNECT, before the client has an
//     ID, for any keepalive up to 5 s) is dropped: the gateway bounds
//     keepalives itself (Limits.KeepaliveMin/Max).
//   - "error processing packet" keeps the error, client, listener and
//     packet type; the packet itself (payload, password) is not logged.
//   - "client store quota reached" and "packet ids exhausted" (a message
//     to a client with no room in flight, so dropped) are counted
//     (Stats.SlowSubscriberDrops) and logged with the client; so is the
//     gateway's own "client write queue full" (drops.go), for what mochi
//     drops without a word.
//
// Everything else passes through.
type mochiHandler struct {
	slog.Handler
	l *mochiLimits
}

// mochiLimits is the state mochiHandler's copies share.
type mochiLimits struct {
	logs *logLimiter
	// held counts the lines held back since the last one logged, of
	// all kinds.
	held atomic.Uint64
	// inflightDrops counts messages mochi dropped for a client with no
	// room in flight.
	inflightDrops atomic.Uint64
}

// Messages of mochi's lines this handler rewrites or drops (server.go,
// clients.go, hooks.go of mochi v2.7.9).
const (
	mochiKeepaliveWarning = "client keepalive is below minimum recommended value and may exhibit connection instability"
	mochiProcessingError  = "error processing packet"
	mochiInflightFull     = "client store quota reached"
	mochiPacketIDs        = "packet ids exhausted"
	mochiWriteQueueFull   = "client write queue full; message dropped"
)

// Enabled lets mochi's warnings through whatever the level of the
// handler under it: the slow-subscriber drops among them are counted
// here (Stats.SlowSubscriberDrops), and a gateway logging at error (or
// a test discarding its log) counted none. Handle then passes on only
// what the handler under it takes.
func (h mochiHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn || h.Handler.Enabled(ctx, level)
}

func (h mochiHandler) Handle(ctx context.Context, r slog.Record) error {
	drop := r.Message == mochiInflightFull || r.Message == mochiPacketIDs || r.Message == mochiWriteQueueFull
	if drop {
		h.l.inflightDrops.Add(1)
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	if drop {
		return h.limited(ctx, r, "")
	}
	switch r.Message {
	case "publish packet rejected", "packet rejected":
		if r.Level < slog.LevelInfo {
			return nil
		}
	case mochiKeepaliveWarning:
		return nil
	case mochiProcessingError:
		return h.limited(ctx, r, "error")
	}
	return h.Handler.Handle(ctx, r)
}

// limited logs r, without any packet in it, unless a line of the same
// kind (its message and the value of attribute by, if any) was logged
// within mochiLogWindow.
func (h mochiHandler) limited(ctx context.Context, r slog.Record, by string) error {
	key := r.Message
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		switch v := a.Value.Any().(type) {
		case packets.Packet:
			out.AddAttrs(slog.String("packet", packetName(v.FixedHeader.Type)))
		default:
			if a.Key == by {
				key += "\x00" + a.Value.String()
			}
			out.AddAttrs(a)
		}
		return true
	})
	if !h.l.logs.allow(logMochi, key, mochiLogWindow) {
		h.l.held.Add(1)
		return nil
	}
	if n := h.l.held.Swap(0); n > 0 {
		out.AddAttrs(slog.Uint64("suppressed", n))
	}
	return h.Handler.Handle(ctx, out)
}

// packetName returns the lowercase name of an MQTT packet type.
func packetName(t byte) string {
	switch t {
	case packets.Connect:
		return "connect"
	case packets.Publish:
		return "publish"
	case packets.Puback:
		return "puback"
	case packets.Pubrec:
		return "pubrec"
	case packets.Pubrel:
		return "pubrel"
	case packets.Pubcomp:
		return "pubcomp"
	case packets.Subscribe:
		return "subscribe"
	case packets.Unsubscribe:
		return "unsubscribe"
	case packets.Pingreq:
		return "pingreq"
	case packets.Disconnect:
		return "disconnect"
	case packets.Auth:
		return "auth"
	}
	return "unknown"
}

func (h mochiHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return mochiHandler{h.Handler.WithAttrs(attrs), h.l}
}

func (h mochiHandler) WithGroup(name string) slog.Handler {
	return mochiHandler{h.Handler.WithGroup(name), h.l}
}
