package config

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestLogFormat: log.format json writes one JSON object a line with
// the keys a text line has; anything but text or json is refused.
func TestLogFormat(t *testing.T) {
	lines := make(map[string]string)
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		lv := new(slog.LevelVar)
		log := slog.New(Log{Format: format}.Handler(&buf, lv))
		log.Debug("hidden")
		log.Info("gateway started", "version", "v1", "addr", "127.0.0.1:1883")
		lv.Set(slog.LevelDebug)
		log.Debug("shown")
		lines[format] = buf.String()
	}
	text := strings.Split(strings.TrimSpace(lines["text"]), "\n")
	js := strings.Split(strings.TrimSpace(lines["json"]), "\n")
	if len(text) != 2 || len(js) != 2 {
		t.Fatalf("want 2 lines each (the level var followed):\ntext:\n%s\njson:\n%s", lines["text"], lines["json"])
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(js[0]), &obj); err != nil {
		t.Fatalf("json line %q: %v", js[0], err)
	}
	var textKeys []string
	for _, f := range strings.Fields(strings.ReplaceAll(text[0], `"gateway started"`, "x")) {
		k, _, _ := strings.Cut(f, "=")
		textKeys = append(textKeys, k)
	}
	slices.Sort(textKeys)
	if jsonKeys := slices.Sorted(maps.Keys(obj)); !slices.Equal(textKeys, jsonKeys) {
		t.Fatalf("text keys %v, json keys %v", textKeys, jsonKeys)
	}

	c := Default()
	c.Log.Format = "xml"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `log.format: must be text or json (got "xml")`) {
		t.Fatalf("Validate with log.format xml: %v", err)
	}
}
