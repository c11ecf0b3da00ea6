package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// TestForwardDeadLettersStrandedProcess: dead letters and a backlog
// held by an entry "old2" (a real redis-server refusing one device's
// stream with WRONGTYPE) are never stranded. With forward: [] or no
// forward: at all, or with the entry renamed "new2", the start is
// refused naming the log, its messages and its dead letters (before,
// each started silently: the renamed entry showed 0 dead letters).
// With adopt: [old2], new2 lists old2's dead letters, sends its
// backlog, and replays them. One dead letter damaged in the data file
// (its bbolt record overwritten) is listed damaged while the others are
// listed and replayed (before, list and replay answered 500), and is
// dropped by its ID; each replayed message reaches the stream under the
// ID it was listed with.
func TestForwardDeadLettersStrandedProcess(t *testing.T) {
	dir := t.TempDir()
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := context.Background()
	const bad = "devices/dev-00/t"
	if err := rc.Set(ctx, bad, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	entry := func(name, to, extra string) string {
		return writeConfig(t, fmt.Sprintf("forward: [{name: %s, to: %q, topics: [\"devices/#\"], stream: \"{topic}\"%s}]\n", name, to, extra))
	}
	upstream := func(g *gw) map[string]any {
		_, v := g.call(t, "GET", "/api/v1/forward", "")
		return v["upstreams"].([]any)[0].(map[string]any)
	}

	// Dead letters: dev-00's messages, refused.
	g := startGW(t, dir, "--config", entry("old2", "redis://"+srv.Addr, ""))
	f := startFleet(g.mqtt, 3, 10*time.Millisecond)
	poll.Until(t, 30*time.Second, "7 dead letters", func() bool { return upstream(g)["dead_letters"].(float64) >= 7 })
	f.halt()
	poll.Until(t, 30*time.Second, "the backlog sent", func() bool { return upstream(g)["backlog_messages"].(float64) == 0 })
	// From the data file (the counts in /api/v1/forward follow each
	// move's commit).
	_, v := g.call(t, "GET", "/api/v1/forward/old2/dead?limit=1", "")
	dead := int(v["total"].(float64))
	g.stop()

	// A backlog too: the same entry, its destination unreachable.
	nowhere, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	g = startGW(t, dir, "--config", entry("old2", "redis://"+nowhere, ""))
	f = startFleetOf(g.mqtt, []string{"dev-01"}, 10*time.Millisecond, nil)
	poll.Until(t, 30*time.Second, "a backlog of 20", func() bool { return upstream(g)["backlog_messages"].(float64) >= 20 })
	f.halt()
	waiting := int(upstream(g)["backlog_messages"].(float64))
	g.stop()

	want := fmt.Sprintf(`forward log "old2/0" holds %d messages and %d dead letters of "old2"`, waiting, dead)
	for _, c := range []struct{ what, conf string }{
		{"forward: []", writeConfig(t, "forward: []\n")},
		{"no forward:", writeConfig(t, "log:\n  level: info\n")},
		{"old2 renamed new2", entry("new2", "redis://"+srv.Addr, "")},
	} {
		code, _, stderr := runBinary(t, "serve", "--config", c.conf, "--data-dir", dir, "--mqtt-addr", "127.0.0.1:0")
		if code == 0 || !strings.Contains(stderr, want) || !strings.Contains(stderr, `adopt: ["old2"]`) || !strings.Contains(stderr, "gateway forward drop-log old2") {
			t.Fatalf("start with %s: exit %d, want a refusal with %q; stderr:\n%s", c.what, code, want, stderr)
		}
	}

	// One dead letter damaged in the file: its entry's first byte.
	damagedKey := damageDeadLetter(t, dir, "old2/0", 1)

	if err := rc.Del(ctx, bad).Err(); err != nil {
		t.Fatal(err)
	}
	g = startGW(t, dir, "--config", entry("new2", "redis://"+srv.Addr, ", adopt: [old2]"))
	code, list := g.call(t, "GET", "/api/v1/forward/new2/dead?limit=10000", "")
	if code != 200 || int(list["total"].(float64)) != dead {
		t.Fatalf("GET /api/v1/forward/new2/dead: HTTP %d %v; want %d dead letters of old2", code, list, dead)
	}
	ids := map[string]bool{}
	damagedID := ""
	for _, e := range list["dead_letters"].([]any) {
		d := e.(map[string]any)
		id := d["id"].(string)
		if d["log"] != "old2/0" || !strings.HasSuffix(id, "/old2/0/"+fmt.Sprint(d["seq"])) {
			t.Fatalf("dead letter %v: want log old2/0 and an ID ORIGIN/old2/0/SEQ", d)
		}
		if d["damaged"] == true {
			damagedID = id
			continue
		}
		if d["device"] != "dev-00" || d["reason"] != "wrong_type" {
			t.Fatalf("dead letter %v", d)
		}
		ids[id] = true
	}
	if !strings.HasSuffix(damagedID, fmt.Sprintf("/old2/0/%d", damagedKey)) || len(ids) != dead-1 {
		t.Fatalf("damaged %q (key %d), %d sound of %d", damagedID, damagedKey, len(ids), dead)
	}
	poll.Until(t, 30*time.Second, "old2's backlog sent through new2", func() bool { return upstream(g)["backlog_messages"].(float64) == 0 })

	// Replayed: the sound ones, each under its ID; the damaged one stays.
	r := g.mustCall(t, 200, "POST", "/api/v1/forward/new2/dead/replay", "")
	if r["replayed"].(float64) != float64(dead-1) {
		t.Fatalf("replay: %v, want %d", r, dead-1)
	}
	poll.Until(t, 30*time.Second, "the replay in the stream", func() bool {
		n, _ := rc.XLen(ctx, bad).Result()
		return int(n) >= dead-1
	})
	msgs, err := rc.XRange(ctx, bad, "-", "+").Result()
	if err != nil || len(msgs) != dead-1 {
		t.Fatalf("XRANGE %s: %d entries, %v; want %d", bad, len(msgs), err, dead-1)
	}
	for _, m := range msgs {
		if id := m.Values["id"].(string); !ids[id] {
			t.Fatalf("the stream holds %q: not an ID the list gave %v", id, ids)
		}
	}
	if _, v := g.call(t, "GET", "/api/v1/forward/new2/dead", ""); v["total"].(float64) != 1 {
		t.Fatalf("after the replay: %v; want the damaged one", v)
	}
	// Replaying again: nothing left to send, a count all the same.
	if r := g.mustCall(t, 200, "POST", "/api/v1/forward/new2/dead/replay", ""); r["replayed"] != float64(0) {
		t.Fatalf("second replay: %v, want replayed 0", r)
	}
	// An ID that is none: 404, nothing done; the damaged one by its ID.
	if code, v := g.call(t, "DELETE", "/api/v1/forward/new2/dead?id=nope", ""); code != 404 || !strings.Contains(v["error"].(string), "nope") {
		t.Fatalf("DELETE ?id=nope: HTTP %d %v", code, v)
	}
	if r := g.mustCall(t, 200, "DELETE", "/api/v1/forward/new2/dead?id="+url.QueryEscape(damagedID), ""); r["dropped"] != float64(1) {
		t.Fatalf("drop the damaged one: %v", r)
	}
	if r := g.mustCall(t, 200, "DELETE", "/api/v1/forward/new2/dead", ""); r["dropped"] != float64(0) {
		t.Fatalf("drop with none left: %v, want dropped 0", r)
	}
	g.stop()
	t.Logf("%d dead letters and %d messages of old2 refused at 3 starts, adopted by new2; %d replayed under their IDs, 1 damaged dropped", dead, waiting, dead-1)
}

// damageDeadLetter overwrites the first byte of the i-th entry (from 0)
// of log's dead letters in the data file in dir, with the gateway
// stopped, and returns its key.
func damageDeadLetter(t *testing.T, dir, log string, i int) uint64 {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, persist.FileName), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var key uint64
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("forward-dead")).Bucket([]byte(log))
		c := b.Cursor()
		k, v := c.First()
		for range i {
			k, v = c.Next()
		}
		if k == nil {
			return fmt.Errorf("no entry %d", i)
		}
		for _, x := range k {
			key = key<<8 | uint64(x)
		}
		v = append([]byte{0xff}, v[1:]...)
		return b.Put(k, v)
	})
	if err != nil {
		t.Fatal(err)
	}
	return key
}
