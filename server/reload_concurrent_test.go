package server

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/logtest"
)

// gatewayFile is a test gateway's configuration file (ports 0, the
// token test-token, data in dir) with limits, the YAML under "limits:".
func gatewayFile(dir, limits string) string {
	return fmt.Sprintf(`mqtt: {tcp: "127.0.0.1:0"}
admin: {addr: "127.0.0.1:0", token: test-token}
data_dir: %q
persist: {snapshot_interval: 100ms}
limits:
%s`, dir, limits)
}

// reloadFile is a configuration file whose rule r has the quota
// ruleLimit and whose class c has classLimit, both per hour.
func reloadFile(dir string, ruleLimit, classLimit int) string {
	return gatewayFile(dir, fmt.Sprintf(`  default: {limit: 1000, window: 1h}
  rules:
    - name: r
      match: {client_id: "r-*"}
      quota: {limit: %d, window: 1h}
      classes:
        - {name: c, topics: ["devices/+/c/#"], quota: {limit: %d, window: 1h}}
`, ruleLimit, classLimit))
}

// writeWhole replaces path's content by text as an operator's editor
// does, by a rename: a reader sees the old file or the new, whole.
func writeWhole(t *testing.T, path, text string) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".edit-*")
	if err == nil {
		_, err = io.WriteString(tmp, text)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		t.Error(err)
	}
}

// loadFile is what `gateway serve` gives a gateway as Deps.Load: the
// file read again and validated.
func loadFile(path string) func() (config.Config, error) {
	return func() (config.Config, error) {
		c, err := config.ReadFile(path)
		if err == nil {
			err = c.Validate()
		}
		return c, err
	}
}

// limitPair is rule r's limit and class c's, as in force or as a file
// sets them.
type limitPair struct{ rule, class int }

var (
	pairA = limitPair{5, 7}
	pairB = limitPair{50, 70}
)

// inForce returns the pair the gateway's resolver holds now.
func inForce(g *Gateway) limitPair {
	q, cs, _ := g.resolver.RuleClasses("r-1", "")
	if len(cs) != 1 {
		return limitPair{q.Limit, -1}
	}
	return limitPair{q.Limit, cs[0].Quota.Limit}
}

// changedPair returns the pair a reload's changes move from and to;
// ok is false when they change one of the two limits alone (a mix).
func changedPair(changes []config.Change) (from, to limitPair, changed, ok bool) {
	var n int
	for _, c := range changes {
		var f, t *int
		switch c.Key {
		case "limits.rules[r].quota.limit":
			f, t = &from.rule, &to.rule
		case "limits.rules[r].classes[c].quota.limit":
			f, t = &from.class, &to.class
		default:
			return from, to, true, false // nothing else differs between the files
		}
		n++
		*f, _ = strconv.Atoi(c.Old)
		*t, _ = strconv.Atoi(c.New)
	}
	return from, to, n > 0, n == 0 || n == 2
}

// reloadAnswer is one operator's reload: whether it applied and what it
// said.
type reloadAnswer struct {
	ok      bool
	changes []config.Change
	text    string
}

// postReload is POST /api/v1/reload, as `gateway reload` sends it.
func postReload(base string) (reloadAnswer, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/reload", nil)
	req.Header.Set("Authorization", "Bearer test-token")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return reloadAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reloadAnswer{}, err
	}
	a := reloadAnswer{ok: resp.StatusCode == http.StatusOK, text: string(b)}
	switch resp.StatusCode {
	case http.StatusOK:
		var body struct {
			Changes []config.Change `json:"changes"`
		}
		if err := json.Unmarshal(b, &body); err != nil {
			return a, fmt.Errorf("200 %s: %w", b, err)
		}
		a.changes = body.Changes
	case http.StatusBadRequest:
	default:
		return a, fmt.Errorf("POST /api/v1/reload: %d %s", resp.StatusCode, b)
	}
	return a, nil
}

// TestReloadConcurrentOperators: two operators rewrite the file and
// reload at the same moment, round after round, one as SIGHUP's handler
// does (ReloadFromSource), the other through POST /api/v1/reload. Every
// reload applies one whole file (rule r's limit and class c's change
// together, from one file's pair to the other's, never one alone); a
// third goroutine reading the resolver meanwhile never sees a mix; after
// each round the pair in force is that of the file on disk (the last
// reload read the last file written); a round where B writes a file that
// does not validate leaves what was in force or A's file, never a part
// of B's; every answer is counted once in the log and the metric; and
// after the burst, GET /api/v1/rules and a real device's publishes show
// the pair in force.
func TestReloadConcurrentOperators(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	data := filepath.Join(dir, "data")
	fileA, fileB := reloadFile(data, pairA.rule, pairA.class), reloadFile(data, pairB.rule, pairB.class)
	invalid := reloadFile(data, 0, 9) // limit 0 does not validate
	writeWhole(t, path, fileA)
	cfg, err := loadFile(path)()
	if err != nil {
		t.Fatal(err)
	}
	logs := new(logtest.Capture)
	g := mustStart(t, cfg, Deps{Load: loadFile(path), Logger: slog.New(logs)})
	base := "http://" + g.AdminAddr().String()

	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	var mixes []limitPair
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if p := inForce(g); p != pairA && p != pairB {
				mixes = append(mixes, p)
			}
		}
	}()

	const rounds = 150
	var oks, errs int
	for round := range rounds {
		before := inForce(g)
		bad := round%3 == 2 // B writes a file that does not validate
		var wg sync.WaitGroup
		var a, b reloadAnswer
		var aErr, bErr error
		wg.Add(2)
		go func() { // operator A: edits, then SIGHUP
			defer wg.Done()
			writeWhole(t, path, fileA)
			a.changes, aErr = g.ReloadFromSource()
			a.ok = aErr == nil
		}()
		go func() { // operator B: edits, then gateway reload
			defer wg.Done()
			text := fileB
			if bad {
				text = invalid
			}
			writeWhole(t, path, text)
			b, bErr = postReload(base)
		}()
		wg.Wait()
		if bErr != nil {
			t.Fatalf("round %d: B: %v", round, bErr)
		}
		if aErr != nil && !strings.Contains(aErr.Error(), "limits.rules[0].quota.limit") {
			t.Fatalf("round %d: A's reload failed without naming the bad key: %v", round, aErr)
		}
		if !b.ok && !strings.Contains(b.text, "limits.rules[0].quota.limit") {
			t.Fatalf("round %d: B's reload answered %s, naming no bad key", round, b.text)
		}
		for who, ans := range map[string]reloadAnswer{"A": a, "B": b} {
			if !ans.ok {
				errs++
				continue
			}
			oks++
			from, to, changed, whole := changedPair(ans.changes)
			if !whole || changed && (from != pairA && from != pairB || to != pairA && to != pairB) {
				t.Fatalf("round %d: %s's reload answered changes %v: not one whole file", round, who, ans.changes)
			}
		}
		now := inForce(g)
		if bad {
			// Only A's file was valid this round.
			want := before
			if a.ok || b.ok {
				want = pairA
			}
			if now != want {
				t.Fatalf("round %d (B's file invalid, A ok %v, B ok %v): %v in force, want %v", round, a.ok, b.ok, now, want)
			}
			continue
		}
		onDisk, err := loadFile(path)()
		if err != nil {
			t.Fatal(err)
		}
		want := limitPair{onDisk.Limits.Rules[0].Quota.Limit, onDisk.Limits.Rules[0].Classes[0].Quota.Limit}
		if now != want {
			t.Fatalf("round %d: %v in force after both reloads, but the file they read last says %v (A: %v, B: %s)", round, now, want, a.changes, b.text)
		}
	}
	close(stop)
	sampler.Wait()
	if len(mixes) > 0 {
		t.Fatalf("the resolver held a mix of the files %d times: %v", len(mixes), mixes[0])
	}
	t.Logf("%d rounds: %d reloads applied, %d refused", rounds, oks, errs)

	// Every answer is counted once, in the log and in the metric.
	if n := logs.Count("configuration reloaded"); n != oks {
		t.Fatalf("%d log lines of a reload, %d reloads applied", n, oks)
	}
	if n := logs.Count("configuration not reloaded; the running configuration stays"); n != errs {
		t.Fatalf("%d log lines of a refusal, %d refused", n, errs)
	}
	if ok, bad := metric(t, base+"/metrics", `devicegate_config_reloads_total{result="ok"}`), metric(t, base+"/metrics", `devicegate_config_reloads_total{result="invalid"}`); int(ok) != oks || int(bad) != errs {
		t.Fatalf("metric: %v ok, %v invalid; want %d and %d", ok, bad, oks, errs)
	}

	// What is in force is what the admin API and a device see.
	final := inForce(g)
	var view struct {
		Quota   struct{ Limit int }
		Source  string
		Classes []struct {
			Name  string
			Quota struct{ Limit int }
		}
	}
	body := httpGet(t, base+"/api/v1/devices/r-1", "test-token")
	if err := json.Unmarshal([]byte(body), &view); err != nil {
		t.Fatal(err)
	}
	if view.Source != "rule:r" || len(view.Classes) != 1 || (limitPair{view.Quota.Limit, view.Classes[0].Quota.Limit}) != final {
		t.Fatalf("GET /api/v1/devices/r-1: %s; %v in force", body, final)
	}
	dev, err := connectAs(t, g, "r-1", "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		topic string
		limit int
	}{{"devices/r-1/t", final.rule}, {"devices/r-1/c/x", final.class}} {
		admitted := 0
		for range c.limit + 1 {
			if publishCode(t, dev, c.topic) == 0 {
				admitted++
			}
		}
		if admitted != c.limit {
			t.Fatalf("%s: %d of %d admitted, want %d (in force %v)", c.topic, admitted, c.limit+1, c.limit, final)
		}
	}
}
