// Package logtest holds the slog handler the gateway's tests read log
// records back from.
package logtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// Capture records every log record at every level. Safe for concurrent
// use; the zero value is ready.
type Capture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *Capture) Enabled(context.Context, slog.Level) bool { return true }

func (h *Capture) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}

func (h *Capture) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *Capture) WithGroup(string) slog.Handler      { return h }

// fields returns a record's level and attributes.
func fields(r slog.Record) map[string]string {
	m := map[string]string{"level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	return m
}

// Find returns the level and attributes of the first record whose
// message starts with msg, or nil.
func (h *Capture) Find(msg string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if strings.HasPrefix(r.Message, msg) {
			return fields(r)
		}
	}
	return nil
}

// Count returns how many records have message msg.
func (h *Capture) Count(msg string) int { return len(h.All(msg)) }

// All returns the level and attributes of every record with message msg.
func (h *Capture) All(msg string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.recs {
		if r.Message == msg {
			out = append(out, fields(r))
		}
	}
	return out
}

// String lists the records, one a line.
func (h *Capture) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, r := range h.recs {
		fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%s", a.Key, a.Value); return true })
		b.WriteByte('\n')
	}
	return b.String()
}
