package main

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestForwardRenameProcess: a forward: entry renamed while its log holds
// a backlog never strands it. The start with the new name is refused,
// naming the log and its count; with adopt: the new entry sends the old
// log, and every message arrives. Renamed again with a backlog, the
// start is refused again; gateway forward drop-log drops the log, says
// how many, and the gateway starts.
func TestForwardRenameProcess(t *testing.T) {
	dir := t.TempDir()
	nowhere, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	entry := func(name, to, extra string) string {
		return writeConfig(t, fmt.Sprintf("forward: [{name: %s, to: %q, topics: [\"devices/#\"]%s}]\n", name, to, extra))
	}
	// A backlog in old's log: its upstream does not listen.
	g := startGW(t, dir, "--config", entry("old", "mqtt://"+nowhere, ""))
	f := startFleet(g.mqtt, 5, 10*time.Millisecond)
	poll.Until(t, 20*time.Second, "a backlog", func() bool {
		_, v := g.call(t, "GET", "/api/v1/forward", "")
		return v["upstreams"].([]any)[0].(map[string]any)["backlog_messages"].(float64) >= 100
	})
	acked := f.halt()
	g.stop()
	total := 0
	for _, n := range acked {
		total += n
	}

	up := mosquittotest.Start(t)
	var arrived sync32
	back := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend"))
	if tok := back.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("backend: %v", tok.Error())
	}
	t.Cleanup(func() { back.Disconnect(0) })
	if tok := back.Subscribe("devices/#", 1, func(mqtt.Client, mqtt.Message) { arrived.add() }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	// Renamed: refused, naming the log and its count.
	code, _, stderr := runBinary(t, "serve", "--config", entry("new", "mqtt://"+up.Addr, ""), "--data-dir", dir, "--mqtt-addr", "127.0.0.1:0")
	want := fmt.Sprintf(`forward log "old/0" holds %d messages of "old"`, total)
	if code == 0 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "adopt") || !strings.Contains(stderr, "gateway forward drop-log old") {
		t.Fatalf("start with the entry renamed: exit %d, want a refusal with %q; stderr:\n%s", code, want, stderr)
	}
	t.Logf("refused: %s", lastLine(stderr))

	// Adopted: the old log drained through the new entry.
	g = startGW(t, dir, "--config", entry("new", "mqtt://"+up.Addr, ", adopt: [old]"))
	poll.Until(t, 30*time.Second, "the old log drained upstream", func() bool { return arrived.get() >= total })
	poll.Until(t, 10*time.Second, "the backlog empty", func() bool {
		_, v := g.call(t, "GET", "/api/v1/forward", "")
		return v["upstreams"].([]any)[0].(map[string]any)["backlog_messages"].(float64) == 0
	})

	// A backlog under new, renamed again, dropped by the command.
	up.Stop()
	f = startFleet(g.mqtt, 5, 10*time.Millisecond)
	poll.Until(t, 20*time.Second, "a backlog", func() bool {
		_, v := g.call(t, "GET", "/api/v1/forward", "")
		return v["upstreams"].([]any)[0].(map[string]any)["backlog_messages"].(float64) >= 50
	})
	f.halt()
	_, v := g.call(t, "GET", "/api/v1/forward", "")
	waiting := int(v["upstreams"].([]any)[0].(map[string]any)["backlog_messages"].(float64))
	g.stop()
	newer := entry("newer", "mqtt://"+nowhere, "")
	if code, _, stderr := runBinary(t, "serve", "--config", newer, "--data-dir", dir, "--mqtt-addr", "127.0.0.1:0"); code == 0 || !strings.Contains(stderr, `forward log "new/0"`) {
		t.Fatalf("start with new renamed: exit %d; stderr:\n%s", code, stderr)
	}
	code, out, stderr := runBinary(t, "forward", "drop-log", "new", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("dropped %d messages and 0 dead letters of forward log new/0", waiting)) {
		t.Fatalf("forward drop-log new: exit %d, want %d dropped\n%s%s", code, waiting, out, stderr)
	}
	g = startGW(t, dir, "--config", newer)
	g.stop()
	t.Logf("%d messages adopted and delivered; %d dropped by drop-log", total, waiting)
}

// sync32 counts arrivals.
type sync32 struct{ n atomic.Int64 }

func (s *sync32) add()     { s.n.Add(1) }
func (s *sync32) get() int { return int(s.n.Load()) }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
