package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/server"
)

// TestExampleConfigStarts runs a gateway process on
// deploy/gateway.example.yaml as it is, but for its ports (free ones
// instead of 1883 and 8080, so that it runs beside other tests) and its
// data directory: it listens, takes a device, and stops cleanly.
func TestExampleConfigStarts(t *testing.T) {
	example := filepath.Join(sourceDir, "..", "..", "deploy", "gateway.example.yaml")
	p := start(t, "serve", "--config", example, "--mqtt-addr", "127.0.0.1:0", "--data-dir", t.TempDir())
	addr := p.waitLine(listeningRE, 10*time.Second)[1]
	quota := p.waitLine(quotaRE, 5*time.Second)[1]
	if !strings.Contains(quota, "rules=3") {
		t.Errorf("the example's quota line %q, want its 3 rules", quota)
	}
	conn := mqttConnect(t, addr, "meter-1", "")
	conn.Close()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, _ := p.wait(server.ShutdownTimeout + 2*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM; stderr:\n%s", code, p.stderr())
	}
}
