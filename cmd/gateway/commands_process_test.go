package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestCommandsAcrossRestartsProcess: commands published upstream (a
// real Mosquitto) for devices that keep their session (MQTT 3.1.1,
// clean session off), five away and one connected, while a real
// gateway process forwarding with subscribe: and persistent_session is
// killed (SIGKILL) twice and stopped (SIGTERM) once, each time started
// again; commands keep coming while it is down (Mosquitto queues them
// in the gateway's session upstream). The devices away then connect
// again, and each device has every command, none lost: a command is
// acknowledged upstream only once the device's kept session holds it in
// the data file. Duplicates are bounded by what the gateway kept and
// had not yet acknowledged upstream at each restart (the upstream's
// in-flight window), and what the connected device had not yet
// acknowledged. Over an MQTT 3.1.1 and an MQTT 5 upstream. (Before,
// the commands acknowledged upstream and held in memory were lost at
// every restart.)
func TestCommandsAcrossRestartsProcess(t *testing.T) {
	for _, version := range []string{"3.1.1", "5"} {
		t.Run("mqtt "+version, func(t *testing.T) { commandsAcrossRestarts(t, version) })
	}
}

func commandsAcrossRestarts(t *testing.T, version string) {
	const devices, every = 5, 20 * time.Millisecond
	up := mosquittotest.StartWith(t, mosquittotest.Options{MaxQueued: 100000})
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	conf := writeConfig(t, fmt.Sprintf(`forward: [{name: cloud, to: "mqtt://%s", mqtt_version: %q, topics: ["devices/+/t"], subscribe: ["devices/+/cmd"], persistent_session: true}]
`, up.Addr, version))
	dir := t.TempDir()
	args := []string{"--config", conf, "--mqtt-addr", addr}
	g := startGW(t, dir, args...)
	connected := func() {
		t.Helper()
		var v any
		deadline := time.Now().Add(20 * time.Second)
		for _, v = g.call(t, "GET", "/api/v1/forward", ""); !strings.Contains(fmt.Sprint(v), "connected:1"); _, v = g.call(t, "GET", "/api/v1/forward", "") {
			if time.Now().After(deadline) {
				t.Fatalf("no upstream connection after 20s: %v\ngateway stderr:\n%s", v, g.stderr())
			}
			time.Sleep(10 * time.Millisecond) // polling the admin API
		}
	}
	connected()

	// The devices subscribe with a kept session, and leave; one more,
	// the last, stays connected (and connects again after each restart).
	var mu sync.Mutex
	got := map[string][]int{}
	device := func(id string, live bool) mqtt.Client {
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetCleanSession(false).
			SetAutoReconnect(live).SetMaxReconnectInterval(100 * time.Millisecond).SetOrderMatters(true).
			SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
				n, _ := strconv.Atoi(string(m.Payload()))
				mu.Lock()
				got[id] = append(got[id], n)
				mu.Unlock()
			}))
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("%s: connect: %v", id, tok.Error())
		}
		return c
	}
	var live mqtt.Client
	for i := range devices + 1 {
		id := fmt.Sprintf("dev-%02d", i)
		c := device(id, i == devices)
		if tok := c.Subscribe("devices/"+id+"/cmd", 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("%s: subscribe: %v", id, tok.Error())
		}
		if i < devices {
			c.Disconnect(100)
		} else {
			live = c
		}
	}
	defer live.Disconnect(0)

	// A backend publishes commands upstream all along, numbered per
	// device.
	back := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr).SetClientID("backend"))
	if tok := back.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("backend: %v", tok.Error())
	}
	defer back.Disconnect(0)
	var sent atomic.Int64
	var pubErr atomic.Pointer[string] // the backend's first failed publish
	stop := make(chan struct{})
	done := make(chan int)
	// The publisher stops on every way out of the test: a t.Errorf from
	// it after the test returned would panic and hide the failure.
	var stopOnce sync.Once
	n := 0
	stopPublisher := func() {
		stopOnce.Do(func() {
			close(stop)
			n = <-done
		})
	}
	defer stopPublisher()
	go func() {
		n := 0
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- n
				return
			case <-tick.C:
			}
			n++
			for i := range devices + 1 {
				tok := back.Publish(fmt.Sprintf("devices/dev-%02d/cmd", i), 1, false, strconv.Itoa(n))
				if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
					msg := fmt.Sprintf("backend: command %d to dev-%02d not acknowledged by mosquitto within 10s: %v", n, i, tok.Error())
					pubErr.CompareAndSwap(nil, &msg)
				}
			}
			sent.Store(int64(n))
		}
	}()
	// commands waits until n more commands a device were published.
	commands := func(n int64) {
		from := sent.Load()
		poll.Until(t, 30*time.Second, "commands published", func() bool { return sent.Load() >= from+n })
	}

	kills := 0
	for _, stage := range []string{"kill", "kill", "stop"} {
		commands(25) // the gateway receives them
		t.Logf("%s at command %d", stage, sent.Load())
		if stage == "kill" {
			g.kill()
			kills++
		} else {
			g.stop()
		}
		commands(25) // queued upstream while the gateway is down
		g = startGW(t, dir, args...)
		connected()
	}
	commands(25)
	stopPublisher()
	if msg := pubErr.Load(); msg != nil {
		t.Fatal(*msg)
	}
	if t.Failed() {
		return
	}

	// The devices come back: each gets commands 1..n.
	var clients []mqtt.Client
	for i := range devices {
		clients = append(clients, device(fmt.Sprintf("dev-%02d", i), false))
	}
	defer func() {
		for _, c := range clients {
			c.Disconnect(0)
		}
	}()
	check := func() (missing, dups int, sample string) {
		mu.Lock()
		defer mu.Unlock()
		for i := range devices + 1 {
			id := fmt.Sprintf("dev-%02d", i)
			seen := map[int]bool{}
			for _, c := range got[id] {
				if seen[c] {
					dups++
				}
				seen[c] = true
			}
			for c := 1; c <= n; c++ {
				if !seen[c] {
					missing++
					if len(sample) < 400 {
						sample += fmt.Sprintf("%s: command %d of %d (got %d); ", id, c, n, len(got[id]))
					}
				}
			}
		}
		return missing, dups, sample
	}
	var missing, dups int
	var sample string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling the devices' arrivals
		if missing, dups, sample = check(); missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(g.stderr(), "\n") {
				if strings.Contains(l, "WARN") || strings.Contains(l, "ERROR") {
					lines = append(lines, l)
				}
			}
			if len(lines) > 80 {
				lines = lines[len(lines)-80:]
			}
			t.Fatalf("%d of %d commands never reached their device: %s\ngateway:\n%s", missing, n*(devices+1), sample, strings.Join(lines, "\n"))
		}
	}
	// Duplicates: what the upstream had sent and the gateway kept but
	// not yet acknowledged when it went away, at most the upstream's
	// in-flight window per restart: Mosquitto's max_inflight_messages
	// (20) over MQTT 3.1.1, the Receive Maximum the gateway announces
	// (64) over MQTT 5; and what the connected device had been sent and
	// had not acknowledged yet (a few: it acknowledges at once).
	window := 20
	if version == "5" {
		window = 64
	}
	if bound := 3 * (window + 20); dups > bound {
		t.Fatalf("%d duplicates, more than %d (the upstream's in-flight window of %d and 20 to the connected device, per restart)", dups, bound, window)
	}
	g.stop()
	t.Logf("MQTT %s upstream: %d devices away and 1 connected, %d commands each, %d kills and a stop of the gateway: all delivered, %d duplicates", version, devices, n, kills, dups)
}
