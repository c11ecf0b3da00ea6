package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mosquittoTool finds a mosquitto client program; `make test` installs
// them, so a missing one is a failure, never a skip.
func mosquittoTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found (package mosquitto-clients; `make test` installs it): %v", name, err)
	}
	return path
}

// TestMosquittoClientsThrottled runs the gateway binary as a fresh
// checkout would, and drives it with the stock mosquitto_pub and
// mosquitto_sub: every mosquitto_pub run is a new connection of the same
// device, so it also shows that a reconnect does not reset the window.
func TestMosquittoClientsThrottled(t *testing.T) {
	pub, sub := mosquittoTool(t, "mosquitto_pub"), mosquittoTool(t, "mosquitto_sub")
	p := start(t, "--mqtt-addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--limit", "3", "--window", "1h")
	host, port, err := net.SplitHostPort(p.waitLine(listeningRE, 10*time.Second)[1])
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subCmd := exec.CommandContext(ctx, sub, "-h", host, "-p", port, "-i", "watcher", "-t", "devices/#", "-v", "-q", "1")
	out, err := subCmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := subCmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { subCmd.Process.Kill(); subCmd.Wait() }()
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// The subscription is in place once a probe message comes back.
	waitSubscribed(t, ctx, pub, host, port, lines)

	publish := func(device, version, msg string) string {
		cmd := exec.CommandContext(ctx, pub, "-h", host, "-p", port, "-i", device, "-V", version, "-q", "1",
			"-t", "devices/"+device, "-m", msg)
		b, _ := cmd.CombinedOutput()
		return strings.TrimSpace(string(b))
	}
	var refusals []string
	for i := 1; i <= 5; i++ {
		if o := publish("meter-1", "mqttv5", fmt.Sprint("v5 reading ", i)); o != "" {
			refusals = append(refusals, o)
		}
	}
	for i := 1; i <= 2; i++ { // MQTT 3.1.1: acknowledged, not forwarded
		if o := publish("meter-1", "mqttv311", fmt.Sprint("v311 reading ", i)); o != "" {
			t.Errorf("mosquitto_pub 3.1.1 printed %q; a 3.1.1 publisher gets a normal PUBACK", o)
		}
	}
	if len(refusals) != 2 {
		t.Errorf("mosquitto_pub reported %d refusals, want 2 (readings 4 and 5): %q", len(refusals), refusals)
	}
	for _, r := range refusals {
		if !strings.Contains(strings.ToLower(r), "quota exceeded") {
			t.Errorf("refusal %q does not say quota exceeded", r)
		}
	}
	publish("marker", "mqttv5", "end")

	var got []string
	for line := range lines {
		if line == "devices/marker end" {
			break
		}
		got = append(got, line)
	}
	want := []string{"devices/meter-1 v5 reading 1", "devices/meter-1 v5 reading 2", "devices/meter-1 v5 reading 3"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("subscriber got %q, want %q; gateway stderr:\n%s", got, want, p.stderr())
	}
	if !strings.Contains(p.stderr(), `msg="device throttled" device=meter-1`) {
		t.Errorf("the throttled device was not logged; stderr:\n%s", p.stderr())
	}
	if n := strings.Count(p.stderr(), `msg="device throttled"`); n != 1 {
		t.Errorf("device throttled logged %d times within one window, want 1", n)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code, _ := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// waitSubscribed publishes probes from an unthrottled client until one
// reaches the subscriber.
func waitSubscribed(t *testing.T, ctx context.Context, pub, host, port string, lines <-chan string) {
	t.Helper()
	for i := 0; ; i++ {
		probe := fmt.Sprint("probe ", i)
		if err := exec.CommandContext(ctx, pub, "-h", host, "-p", port, "-i", fmt.Sprint("probe-", i),
			"-t", "devices/probe", "-m", probe).Run(); err != nil {
			t.Fatalf("mosquitto_pub probe: %v", err)
		}
		select {
		case line := <-lines:
			if strings.HasPrefix(line, "devices/probe ") {
				for { // drain any later probes that were in flight
					select {
					case <-lines:
					case <-time.After(200 * time.Millisecond):
						return
					}
				}
			}
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("subscriber never received a probe")
		}
	}
}
