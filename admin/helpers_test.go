package admin

import (
	"io"
	"log/slog"
)

func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type fixedStats struct{ s Snapshot }

func (f fixedStats) MetricsSnapshot() Snapshot { return f.s }
