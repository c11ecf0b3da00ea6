package config

import (
	"fmt"
	"io"
	"log/slog"
)

// MarshalYAML writes the level by its configuration name, "info".
func (l Log) MarshalYAML() (any, error) {
	return struct {
		Level  string `yaml:"level"`
		Format string `yaml:"format"`
	}{LevelName(l.Level), l.Format}, nil
}

func (v *validator) logFormat(f string) {
	if f != "text" && f != "json" {
		v.add("log.format", fmt.Sprintf("must be text or json (got %q)", f))
	}
}

// Handler returns the log handler of log.format writing to w, at the
// level lv (a *slog.LevelVar, so that a reload can change it): slog's
// JSON handler for json, its text handler otherwise. Both write the
// same keys: time, level, msg and the line's own.
func (l Log) Handler(w io.Writer, lv slog.Leveler) slog.Handler {
	opts := &slog.HandlerOptions{Level: lv}
	if l.Format == "json" {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}
