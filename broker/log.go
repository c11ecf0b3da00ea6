package broker

import (
	"context"
	"log/slog"
)

var discardLogger = slog.New(slog.DiscardHandler)

// mochiHandler is the slog handler given to mochi. mochi logs every
// publish a hook refuses ("publish packet rejected", Debug, with the whole
// packet and payload): at a throttled device's rate that would flood the
// log with exactly what the throttle hook already logs once per window.
// Those lines are dropped; everything else from mochi passes through.
type mochiHandler struct{ slog.Handler }

// Messages of mochi's per-packet rejection lines (hooks.go).
var mochiPerPacket = map[string]bool{
	"publish packet rejected": true,
	"packet rejected":         true,
}

func (h mochiHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo && mochiPerPacket[r.Message] {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h mochiHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return mochiHandler{h.Handler.WithAttrs(attrs)}
}

func (h mochiHandler) WithGroup(name string) slog.Handler {
	return mochiHandler{h.Handler.WithGroup(name)}
}
