package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestFailedStartLogsJSON: with log.format json, a start that fails
// (its MQTT port taken) ends with the failure as a JSON log line, exit
// status 1, and every line on stderr is JSON. Before, the failure came
// as a plain "gateway: ..." line after the JSON ones.
func TestFailedStartLogsJSON(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	conf := writeConfig(t, "log: {format: json}\nmqtt: {tcp: \""+taken.Addr().String()+"\"}\nadmin: {addr: \"127.0.0.1:0\"}\n")
	var stdout, stderr strings.Builder
	err = run(context.Background(), []string{"serve", "--config", conf, "--data-dir", filepath.Join(t.TempDir(), "data")}, &stdout, &stderr)
	if code := exitCode(err, &stderr); code != 1 {
		t.Fatalf("exit %d (%v), want 1", code, err)
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	var last map[string]any
	for _, l := range lines {
		last = nil
		if err := json.Unmarshal([]byte(l), &last); err != nil {
			t.Fatalf("a line on stderr is not JSON: %q\n%s", l, stderr.String())
		}
	}
	if last["level"] != "ERROR" || last["msg"] != "gateway failed" || !strings.Contains(fmt.Sprint(last["error"]), "address already in use") {
		t.Fatalf("last line %v, want the failure at level ERROR", last)
	}
}
