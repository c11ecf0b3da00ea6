package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// Two operators changing the same device or group at once through the
// admin API. What an operator relies on, checked after each burst of
// conflicting requests:
//
//  1. every answer is true of a state the gateway was in: some order of
//     all requests, each taking effect at one instant between its
//     sending and its answer, explains every answer (a PUT naming what
//     it asked for, a DELETE's 200 or 404, a reset's "reset", a GET's
//     quota and count, a publish's PUBACK) and the GET after the burst;
//  2. publishes are admitted and refused exactly as that GET says;
//  3. a graceful restart on the same data directory shows the same state
//     (memory and the bbolt file agree).
//
// The operators run in lockstep, step k of both sent at the same moment,
// each step on several devices (or groups) at once, so that each step is
// a conflict on each of them and each burst ends with one. A publish is
// a request of the device's own, counted with operator B's (the device
// only publishes between B's resets); the clock stands still, so that
// the counts change only by publishes and resets.

// opsQuota is a one-window quota as the admin API names it; the zero
// value is no override.
type opsQuota struct {
	limit  int
	window time.Duration
}

func (q opsQuota) String() string {
	if q.limit == 0 {
		return "none"
	}
	return fmt.Sprintf("%d/%s", q.limit, q.window)
}

// opsState is what the operators' requests act on: the override in
// force (zero: none) and the count in the window of the device or group
// (every decision at one instant: the clock stands still).
type opsState struct {
	over opsQuota
	used int
}

// opsOp is one request, as answered: when it was sent and answered, and
// step, which returns the state after it and whether its answer is
// possible when it takes effect in state s.
type opsOp struct {
	desc       string
	start, end time.Time
	step       func(s opsState) (opsState, bool)
}

// linearizations returns the states in which some order of a's and b's
// requests (each operator's in its own order) ends, when each request
// takes effect at one instant between its sending and its answer and
// every answer is true of the state it took effect in; none when no such
// order exists. Two sequences leave two candidates at each point: a[i]
// may go first unless b[j] was answered before a[i] was sent (b's later
// requests were sent after b[j]'s answer), and the other way round.
func linearizations(init opsState, a, b []opsOp) []opsState {
	type node struct {
		i, j int
		s    opsState
	}
	seen := map[node]bool{}
	var finals []opsState
	stack := []node{{0, 0, init}}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[n] {
			continue
		}
		seen[n] = true
		if n.i == len(a) && n.j == len(b) {
			finals = append(finals, n.s)
			continue
		}
		if n.i < len(a) && (n.j == len(b) || !b[n.j].end.Before(a[n.i].start)) {
			if s, ok := a[n.i].step(n.s); ok {
				stack = append(stack, node{n.i + 1, n.j, s})
			}
		}
		if n.j < len(b) && (n.i == len(a) || !a[n.i].end.Before(b[n.j].start)) {
			if s, ok := b[n.j].step(n.s); ok {
				stack = append(stack, node{n.i, n.j + 1, s})
			}
		}
	}
	return finals
}

// history formats both operators' requests in the order they were sent,
// with their times from the first, for a failure message.
func history(a, b []opsOp) string {
	type line struct {
		who string
		op  opsOp
	}
	var all []line
	for _, o := range a {
		all = append(all, line{"A", o})
	}
	for _, o := range b {
		all = append(all, line{"B", o})
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].op.start.Before(all[j].op.start) })
	if len(all) == 0 {
		return ""
	}
	t0 := all[0].op.start
	var sb strings.Builder
	for _, l := range all {
		fmt.Fprintf(&sb, "  %s %8dµs..%8dµs %s\n", l.who, l.op.start.Sub(t0).Microseconds(), l.op.end.Sub(t0).Microseconds(), l.op.desc)
	}
	return sb.String()
}

// overlapping counts the i such that a[i] and b[i] were in flight at
// the same time.
func overlapping(a, b []opsOp) int {
	n := 0
	for k := range min(len(a), len(b)) {
		if a[k].start.Before(b[k].end) && b[k].start.Before(a[k].end) {
			n++
		}
	}
	return n
}

// runOperators runs steps steps of two operators, step k of both begun
// at the same moment, and returns the first failure: a connection error, an
// unexpected status, an answer that does not name what was asked. A
// failed step does not stop the others, so that neither operator waits
// for the other forever.
func runOperators(steps int, opA, opB func(k int) error) error {
	bars := make([]sync.WaitGroup, steps)
	for k := range bars {
		bars[k].Add(2)
	}
	var errs [2][]error
	var wg sync.WaitGroup
	run := func(who int, do func(int) error) {
		defer wg.Done()
		for k := range steps {
			bars[k].Done()
			bars[k].Wait()
			if err := do(k); err != nil {
				errs[who] = append(errs[who], fmt.Errorf("operator %c step %d: %w", 'A'+who, k, err))
			}
		}
	}
	wg.Add(2)
	go run(0, opA)
	go run(1, opB)
	wg.Wait()
	for _, e := range append(errs[0], errs[1]...) {
		return e
	}
	return nil
}

// each runs f(0) to f(n-1) at once and returns the first error.
func each(n int, f func(d int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for d := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[d] = f(d)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// record runs requests one after the other, appending each to out.
func record(out *[]opsOp, reqs ...func() (opsOp, error)) error {
	for _, req := range reqs {
		o, err := req()
		if err != nil {
			return err
		}
		*out = append(*out, o)
	}
	return nil
}

// opsClient is an operator's HTTP client: its own connections.
type opsClient struct {
	c     *http.Client
	base  string
	token string
}

func newOpsClient(t *testing.T, g *Gateway) *opsClient {
	tr := &http.Transport{MaxIdleConnsPerHost: opsTargets}
	t.Cleanup(tr.CloseIdleConnections)
	return &opsClient{c: &http.Client{Timeout: 30 * time.Second, Transport: tr}, base: "http://" + g.AdminAddr().String(), token: "test-token"}
}

// call sends a request and returns when it was sent and answered, the
// status and the body.
func (c *opsClient) call(method, path, body string) (start, end time.Time, code int, b []byte, err error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return start, end, 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	start = time.Now()
	resp, err := c.c.Do(req)
	if err != nil {
		return start, time.Now(), 0, nil, err
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(resp.Body)
	end = time.Now()
	return start, end, resp.StatusCode, b, err
}

// decode reads a JSON answer strictly enough to notice a changed shape.
func decode(b []byte, v any) error {
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(v); err != nil {
		return fmt.Errorf("answer %s: %w", b, err)
	}
	return nil
}

// quotaOf reads a one-window quota of an answer.
func quotaOf(limit int, window string) (opsQuota, error) {
	d, err := time.ParseDuration(window)
	if err != nil {
		return opsQuota{}, fmt.Errorf("window %q: %w", window, err)
	}
	return opsQuota{limit, d}, nil
}

// opsTarget is what the operators change: a device's override or a
// group's, with the paths and answers of each.
type opsTarget struct {
	name  string
	def   opsQuota // in force without an override
	quota string   // path of PUT and DELETE
	get   string   // path of GET
	// read reads a GET's answer: the override in force (zero: none,
	// then the quota must be def) and the count.
	read func(b []byte) (opsQuota, int, error)
	// put reads a PUT's answer: the quota it says was set.
	put func(b []byte) (opsQuota, error)
}

func deviceTarget(id string, def opsQuota) opsTarget {
	p := "/api/v1/devices/" + url.PathEscape(id)
	return opsTarget{name: "device " + id, def: def, quota: p + "/quota", get: p,
		read: func(b []byte) (opsQuota, int, error) {
			var d admin.DeviceJSON
			if err := decode(b, &d); err != nil {
				return opsQuota{}, 0, err
			}
			q, err := quotaOf(d.Quota.Limit, d.Quota.Window)
			switch {
			case err != nil:
				return q, 0, err
			case d.Source == "override":
				return q, d.Used, nil
			case d.Source == "default" && q == def:
				return opsQuota{}, d.Used, nil
			}
			return q, 0, fmt.Errorf("answer %s: source %q with quota %s", b, d.Source, q)
		},
		put: func(b []byte) (opsQuota, error) {
			var o admin.OverrideJSON
			if err := decode(b, &o); err != nil {
				return opsQuota{}, err
			}
			return quotaOf(o.Limit, o.Window)
		}}
}

func groupTarget(name string, def opsQuota) opsTarget {
	p := "/api/v1/groups/" + url.PathEscape(name)
	return opsTarget{name: "group " + name, def: def, quota: p + "/quota", get: p,
		read: func(b []byte) (opsQuota, int, error) {
			var g admin.GroupJSON
			if err := decode(b, &g); err != nil {
				return opsQuota{}, 0, err
			}
			if len(g.Quota.Windows) != 1 || g.Quota.Windows[0].Used == nil {
				return opsQuota{}, 0, fmt.Errorf("answer %s: not one window with its count", b)
			}
			w := g.Quota.Windows[0]
			q, err := quotaOf(w.Messages, w.Window)
			switch {
			case err != nil:
				return q, 0, err
			case g.Source == "override":
				return q, *w.Used, nil
			case g.Source == "rule" && q == def:
				return opsQuota{}, *w.Used, nil
			}
			return q, 0, fmt.Errorf("answer %s: source %q with quota %s", b, g.Source, q)
		},
		put: func(b []byte) (opsQuota, error) {
			var g admin.GroupJSON
			if err := decode(b, &g); err != nil {
				return opsQuota{}, err
			}
			if g.Source != "override" {
				return opsQuota{}, fmt.Errorf("answer %s: source %q, want override", b, g.Source)
			}
			return quotaOf(g.Quota.Limit, g.Quota.Window)
		}}
}

// putOp sets q as the target's override; the answer must name q.
func (c *opsClient) putOp(tg opsTarget, q opsQuota) (opsOp, error) {
	body := fmt.Sprintf(`{"limit":%d,"window":"%s"}`, q.limit, q.window)
	start, end, code, b, err := c.call(http.MethodPut, tg.quota, body)
	if err != nil {
		return opsOp{}, err
	}
	if code != http.StatusOK {
		return opsOp{}, fmt.Errorf("PUT %s %s: HTTP %d %s", tg.quota, body, code, b)
	}
	got, err := tg.put(b)
	if err != nil {
		return opsOp{}, err
	}
	if got != q {
		return opsOp{}, fmt.Errorf("PUT %s %s answered %s: names %s, not what was set", tg.quota, body, b, got)
	}
	return opsOp{desc: "PUT " + q.String(), start: start, end: end, step: func(s opsState) (opsState, bool) {
		s.over = q
		return s, true
	}}, nil
}

// deleteOp deletes the target's override: 200 when there was one, 404
// when not.
func (c *opsClient) deleteOp(tg opsTarget) (opsOp, error) {
	start, end, code, b, err := c.call(http.MethodDelete, tg.quota, "")
	if err != nil {
		return opsOp{}, err
	}
	if code != http.StatusOK && code != http.StatusNotFound {
		return opsOp{}, fmt.Errorf("DELETE %s: HTTP %d %s", tg.quota, code, b)
	}
	had := code == http.StatusOK
	return opsOp{desc: fmt.Sprintf("DELETE -> %d", code), start: start, end: end, step: func(s opsState) (opsState, bool) {
		if had != (s.over != opsQuota{}) {
			return s, false
		}
		s.over = opsQuota{}
		return s, true
	}}, nil
}

// getOp reads the target's state.
func (c *opsClient) getOp(tg opsTarget) (opsOp, error) {
	start, end, code, b, err := c.call(http.MethodGet, tg.get, "")
	if err != nil {
		return opsOp{}, err
	}
	if code != http.StatusOK {
		return opsOp{}, fmt.Errorf("GET %s: HTTP %d %s", tg.get, code, b)
	}
	q, used, err := tg.read(b)
	if err != nil {
		return opsOp{}, err
	}
	return opsOp{desc: fmt.Sprintf("GET -> %s used %d", q, used), start: start, end: end, step: func(s opsState) (opsState, bool) {
		return s, s.over == q && s.used == used
	}}, nil
}

// resetOp empties the device's window: "reset" says whether it had one,
// which with the clock standing still is whether it counted anything.
func (c *opsClient) resetOp(id string) (opsOp, error) {
	path := "/api/v1/devices/" + url.PathEscape(id) + "/reset"
	start, end, code, b, err := c.call(http.MethodPost, path, "")
	if err != nil {
		return opsOp{}, err
	}
	var r admin.ResetJSON
	if code != http.StatusOK {
		return opsOp{}, fmt.Errorf("POST %s: HTTP %d %s", path, code, b)
	}
	if err := decode(b, &r); err != nil {
		return opsOp{}, err
	}
	return opsOp{desc: fmt.Sprintf("reset -> %v", r.Reset), start: start, end: end, step: func(s opsState) (opsState, bool) {
		if r.Reset != (s.used > 0) {
			return s, false
		}
		s.used = 0
		return s, true
	}}, nil
}

// refusedBy reads the quota a refusal's reason string names
// ("quota exceeded: 3 messages per 1h0m0s, retry after ...", "quota of
// group acme exceeded: ...").
func refusedBy(reason string) (opsQuota, bool) {
	_, rest, ok := strings.Cut(reason, "exceeded: ")
	if !ok {
		return opsQuota{}, false
	}
	var limit int
	var window string
	if n, _ := fmt.Sscanf(rest, "%d messages per %s", &limit, &window); n != 2 {
		return opsQuota{}, false
	}
	q, err := quotaOf(limit, strings.TrimSuffix(window, ","))
	return q, err == nil
}

// publishOp publishes one QoS 1 message of the device: admitted when
// the count is below the quota in force (def without an override),
// refused naming that quota when not.
func publishOp(cl *mqtttest.Client5, topic string, def opsQuota) (opsOp, error) {
	start := time.Now()
	code, reason, err := cl.PublishReason(topic, "x")
	end := time.Now()
	if err != nil {
		return opsOp{}, fmt.Errorf("publish: %w", err)
	}
	switch code {
	case mqtttest.CodeSuccess:
		return opsOp{desc: "publish -> admitted", start: start, end: end, step: func(s opsState) (opsState, bool) {
			q := s.over
			if q == (opsQuota{}) {
				q = def
			}
			if s.used >= q.limit {
				return s, false
			}
			s.used++
			return s, true
		}}, nil
	case mqtttest.CodeQuotaExceeded:
		by, ok := refusedBy(reason)
		if !ok {
			return opsOp{}, fmt.Errorf("publish refused with reason %q, naming no quota", reason)
		}
		return opsOp{desc: "publish -> refused by " + by.String(), start: start, end: end, step: func(s opsState) (opsState, bool) {
			q := s.over
			if q == (opsQuota{}) {
				q = def
			}
			return s, q == by && s.used >= q.limit
		}}, nil
	}
	return opsOp{}, fmt.Errorf("publish: PUBACK 0x%02x %q", code, reason)
}

// opsRound is one burst on one target and the state it left.
type opsRound struct {
	tg    opsTarget
	dev   string // the device whose publishes the target judges
	topic string
	after opsState // what GET showed last
}

// checkBurst checks a burst's answers against each other and the GET
// after it (promise 1). With publish, it then checks that publishes are
// judged by that state (promise 2): the device is admitted until the
// quota in force is used up, then refused naming it. It returns the
// state GET shows at the end.
func checkBurst(t *testing.T, g *Gateway, r opsRound, cl *mqtttest.Client5, init opsState, a, b []opsOp, publish bool) opsState {
	t.Helper()
	c := newOpsClient(t, g)
	final, err := c.getOp(r.tg)
	if err != nil {
		t.Fatalf("%s after the burst: %v", r.tg.name, err)
	}
	finals := linearizations(init, a, b)
	var got opsState
	found := false
	for _, s := range finals {
		if _, ok := final.step(s); ok {
			got, found = s, true
		}
	}
	if !found {
		t.Fatalf("%s: no order of the requests explains every answer and the %s after them (%d orders end in %v); requests:\n%s",
			r.tg.name, final.desc, len(finals), finals, history(a, b))
	}
	t.Logf("%s: %d+%d requests, the i-th of each in flight at once %d times; ends %s used %d",
		r.tg.name, len(a), len(b), overlapping(a, b), got.over, got.used)
	if !publish {
		return got
	}
	q := got.over
	if q == (opsQuota{}) {
		q = r.tg.def
	}
	for i := got.used; i < q.limit; i++ {
		cl.MustPublish(t, r.topic, fmt.Sprint("within ", q), mqtttest.CodeSuccess)
	}
	wantRefusedBy(t, cl, r, q)
	after, err := c.getOp(r.tg)
	if err != nil {
		t.Fatal(err)
	}
	want := opsState{got.over, q.limit}
	if _, ok := after.step(want); !ok {
		t.Fatalf("%s after the publishes: %s, want %s used %d", r.tg.name, after.desc, want.over, want.used)
	}
	return want
}

// wantRefusedBy publishes and wants a refusal naming q.
func wantRefusedBy(t *testing.T, cl *mqtttest.Client5, r opsRound, q opsQuota) {
	t.Helper()
	code, reason, err := cl.PublishReason(r.topic, "over")
	if by, _ := refusedBy(reason); err != nil || code != mqtttest.CodeQuotaExceeded || by != q {
		t.Fatalf("%s: publish over the quota %s: 0x%02x %q %v, want 0x97 naming %s", r.tg.name, q, code, reason, err, q)
	}
}

// checkRestart restarts the gateway gracefully on the same data
// directory and checks each round's target shows the state it showed
// before (promise 3), and judges the device by it: admitted while the
// count is below the quota, then refused naming it.
func checkRestart(t *testing.T, g *Gateway, cfg config.Config, src devicelimit.TimeSource, rounds []opsRound) *Gateway {
	t.Helper()
	closeGateway(t, g)
	g = mustStart(t, cfg, Deps{Time: src})
	c := newOpsClient(t, g)
	for _, r := range rounds {
		cl := mqtttest.Dial5(t, g.Addr().String(), r.dev) // a group is known once a device joined it
		got, err := c.getOp(r.tg)
		if err != nil {
			t.Fatalf("%s after the restart: %v", r.tg.name, err)
		}
		if _, ok := got.step(r.after); !ok {
			t.Errorf("%s: before the restart GET showed %s used %d, after it %s", r.tg.name, r.after.over, r.after.used, got.desc)
			continue
		}
		q := r.after.over
		if q == (opsQuota{}) {
			q = r.tg.def
		}
		for i := r.after.used; i < q.limit; i++ {
			cl.MustPublish(t, r.topic, fmt.Sprint("within ", q), mqtttest.CodeSuccess)
		}
		wantRefusedBy(t, cl, r, q)
	}
	return g
}

// opsTargets is how many devices (or groups) each test's burst changes,
// opsSteps how many steps each gets. At each step each operator changes
// every target at once (a script over a list of devices), each target's
// requests in order: so the two operators' requests on one target meet
// in the data file's write queue behind those on the others, and the
// order the file takes them in may differ from the order they reached
// memory unless the store orders the two. Each target's last step is a
// conflict of writes.
const (
	opsTargets = 8
	opsSteps   = 12
)

// overrideBurst runs the override tests' burst on targets: at each step
// operator A sets an override of its own and reads the target, B deletes
// the override or sets its own (in turn) and reads. It returns each
// target's requests, by operator.
func overrideBurst(t *testing.T, g *Gateway, targets []opsTarget) (a, b [][]opsOp) {
	t.Helper()
	ca, cb := newOpsClient(t, g), newOpsClient(t, g)
	a, b = make([][]opsOp, len(targets)), make([][]opsOp, len(targets))
	err := runOperators(opsSteps, func(m int) error {
		return each(len(targets), func(d int) error {
			tg := targets[d]
			q := opsQuota{4 + m%5, time.Hour + time.Duration(m+1)*time.Second}
			return record(&a[d], func() (opsOp, error) { return ca.putOp(tg, q) }, func() (opsOp, error) { return ca.getOp(tg) })
		})
	}, func(m int) error {
		return each(len(targets), func(d int) error {
			tg := targets[d]
			if (m+d)%2 == 0 {
				return record(&b[d], func() (opsOp, error) { return cb.deleteOp(tg) }, func() (opsOp, error) { return cb.getOp(tg) })
			}
			q := opsQuota{9 + m%5, 2*time.Hour + time.Duration(m+1)*time.Second}
			return record(&b[d], func() (opsOp, error) { return cb.putOp(tg, q) }, func() (opsOp, error) { return cb.getOp(tg) })
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// startOps starts a gateway on cfg whose clock stands still (every
// decision at one instant), and connects the device of each of the
// opsTargets rounds that round makes.
func startOps(t *testing.T, cfg config.Config, round func(d int) opsRound) (*Gateway, devicelimit.TimeSource, []opsRound, []*mqtttest.Client5) {
	t.Helper()
	src := devicelimit.NewManualTime(time.Now())
	g := mustStart(t, cfg, Deps{Time: src})
	rounds := make([]opsRound, opsTargets)
	clients := make([]*mqtttest.Client5, opsTargets)
	for d := range rounds {
		rounds[d] = round(d)
		clients[d] = mqtttest.Dial5(t, g.Addr().String(), rounds[d].dev) // a group is known from then on
	}
	return g, src, rounds, clients
}

// overrideTest runs the override tests' burst on the targets of round,
// then checks it, then the restart.
func overrideTest(t *testing.T, cfg config.Config, round func(d int) opsRound) {
	g, src, rounds, clients := startOps(t, cfg, round)
	targets := make([]opsTarget, len(rounds))
	for d, r := range rounds {
		targets[d] = r.tg
	}
	a, b := overrideBurst(t, g, targets)
	for d := range rounds {
		rounds[d].after = checkBurst(t, g, rounds[d], clients[d], opsState{}, a[d], b[d], true)
	}
	checkRestart(t, g, cfg, src, rounds)
}

// TestConcurrentDeviceOverrides: two operators set and delete the
// overrides of the same devices at the same moments.
func TestConcurrentDeviceOverrides(t *testing.T) {
	cfg := testConfig(t.TempDir(), 3, time.Hour)
	cfg.Admin.Token = "test-token"
	overrideTest(t, cfg, func(d int) opsRound {
		id := fmt.Sprintf("meter-%d", d)
		return opsRound{tg: deviceTarget(id, opsQuota{3, time.Hour}), dev: id, topic: "devices/" + id}
	})
}

// TestConcurrentGroupOverrides: the same for groups' overrides (10
// messages an hour by the configuration), each judged on a device of
// its group (1000 of its own).
func TestConcurrentGroupOverrides(t *testing.T) {
	cfg := groupConfig(t, t.TempDir())
	cfg.Limits.Rules[0].Quota.Limit = 1000
	overrideTest(t, cfg, func(d int) opsRound {
		name := fmt.Sprintf("acme%d", d)
		dev := "tenant-" + name + "-1"
		return opsRound{tg: groupTarget(name, opsQuota{10, time.Hour}), dev: dev, topic: "devices/" + dev}
	})
}

// TestConcurrentResetAndOverride: at each step operator A sets an
// override of 1 to 4 messages and reads the device; B, in turn, has the
// device publish twice, or resets its window and reads it. Every PUBACK
// must be the one the override in force and the count since the last
// reset give, and the reset count must survive the restart.
func TestConcurrentResetAndOverride(t *testing.T) {
	cfg := testConfig(t.TempDir(), 3, time.Hour)
	cfg.Admin.Token = "test-token"
	def := opsQuota{3, time.Hour}
	g, src, rounds, clients := startOps(t, cfg, func(d int) opsRound {
		id := fmt.Sprintf("meter-%d", d)
		return opsRound{tg: deviceTarget(id, def), dev: id, topic: "devices/" + id}
	})
	for d, r := range rounds {
		clients[d].MustPublish(t, r.topic, "before", mqtttest.CodeSuccess)
	}
	ca, cb := newOpsClient(t, g), newOpsClient(t, g)
	a, b := make([][]opsOp, opsTargets), make([][]opsOp, opsTargets)
	err := runOperators(opsSteps, func(m int) error {
		return each(opsTargets, func(d int) error {
			tg := rounds[d].tg
			q := opsQuota{1 + m%4, time.Hour + time.Duration(m+1)*time.Second}
			return record(&a[d], func() (opsOp, error) { return ca.putOp(tg, q) }, func() (opsOp, error) { return ca.getOp(tg) })
		})
	}, func(m int) error {
		return each(opsTargets, func(d int) error {
			r := rounds[d]
			if m%2 == 0 {
				pub := func() (opsOp, error) { return publishOp(clients[d], r.topic, def) }
				return record(&b[d], pub, pub)
			}
			return record(&b[d], func() (opsOp, error) { return cb.resetOp(r.dev) }, func() (opsOp, error) { return cb.getOp(r.tg) })
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for d := range rounds {
		// The burst's publishes were the check of the decisions; the
		// count the resets left is what the restart must keep.
		rounds[d].after = checkBurst(t, g, rounds[d], clients[d], opsState{used: 1}, a[d], b[d], false)
	}
	checkRestart(t, g, cfg, src, rounds)
}
