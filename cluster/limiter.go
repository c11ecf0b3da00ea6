package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/devicelimit"
)

// Defaults of Options' zero fields.
const (
	DefaultTimeout       = 50 * time.Millisecond
	DefaultRetryInterval = 250 * time.Millisecond
	DefaultPrefix        = "devicegate:"
)

// Sizing of the pipelines: up to maxBatch decisions that arrive
// together go to Redis in one round trip. One pipeline at a time makes
// the largest batches: on a 2-core machine that beat 2 and 4 (55k
// against 50k and 44k decisions/s at 16 callers).
const (
	maxBatch = 128
	workers  = 1
)

// Options configure a Limiter. Client and Local are required.
type Options struct {
	// Client reaches Redis; a *redis.ClusterClient for Redis Cluster.
	// Its read and write timeouts should not exceed Timeout.
	Client redis.UniversalClient
	// Local is this gateway's own table: its bucket count is the shared
	// windows', and PolicyLocal decides on it while Redis is down.
	Local *devicelimit.Table
	// Timeout is the longest a decision waits for Redis
	// (DefaultTimeout when 0).
	Timeout time.Duration
	// Policy decides while Redis is unreachable or slow.
	Policy Policy
	// RetryInterval is how long decisions go straight to the policy
	// after a failure before Redis is tried again
	// (DefaultRetryInterval when 0).
	RetryInterval time.Duration
	// Prefix starts every key and channel name (DefaultPrefix when "").
	// Gateways sharing windows must use the same prefix.
	Prefix string
	// Logger receives the failure and recovery lines; nil discards.
	Logger *slog.Logger
}

// Limiter decides on device windows shared in Redis; AllowAt has the
// decision contract of devicelimit.Table's, and Peek is the one look at
// a shared window without counting (for the admin API). The now
// argument is used only by the failure policy: shared windows run on
// Redis's clock (TIME), the one clock every gateway sees. Use New; Close
// stops its goroutines. Safe for concurrent use.
type Limiter struct {
	rdb     redis.UniversalClient
	local   *devicelimit.Table
	buckets int
	timeout time.Duration
	policy  Policy
	prefix  string
	health  health

	// multi is set for a single Redis server: a batch is one script
	// call. Redis Cluster needs a call per decision (keys in one call
	// must share a slot), pipelined.
	multi bool

	// inflight counts the decisions under way: one alone calls Redis
	// itself, without the hand-off to a pipeline worker.
	inflight atomic.Int64

	reqs chan *request
	pool sync.Pool
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// New builds a limiter and starts its pipeline workers. It does not
// contact Redis: a Redis down at start-up is handled like one that
// fails later.
func New(opts Options) (*Limiter, error) {
	switch {
	case opts.Client == nil:
		return nil, fmt.Errorf("%w: Client is nil", ErrInvalidOptions)
	case opts.Local == nil:
		return nil, fmt.Errorf("%w: Local is nil", ErrInvalidOptions)
	case opts.Timeout < 0 || opts.RetryInterval < 0:
		return nil, fmt.Errorf("%w: Timeout and RetryInterval must be >= 0", ErrInvalidOptions)
	case int(opts.Policy) >= len(policyNames):
		return nil, fmt.Errorf("%w: %d", ErrInvalidPolicy, uint8(opts.Policy))
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.RetryInterval == 0 {
		opts.RetryInterval = DefaultRetryInterval
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{
		rdb: opts.Client, local: opts.Local, buckets: opts.Local.Buckets(),
		timeout: opts.Timeout, policy: opts.Policy, prefix: opts.Prefix,
		health: health{log: log, policy: opts.Policy, retry: opts.RetryInterval, logEvery: 10 * time.Second, start: time.Now()},
		reqs:   make(chan *request, workers*maxBatch),
		stop:   make(chan struct{}),
	}
	_, l.multi = opts.Client.(*redis.Client)
	l.pool.New = func() any {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return &request{done: make(chan struct{}, 1), timer: t}
	}
	l.wg.Add(workers)
	for range workers {
		go l.worker()
	}
	return l, nil
}

// Buckets returns the number of buckets per window.
func (l *Limiter) Buckets() int { return l.buckets }

// windowKey returns the device's window key. The braces make the device
// ID the key's hash tag, so on Redis Cluster a device's keys share a
// slot.
func (l *Limiter) windowKey(device string) string {
	return l.prefix + "w:{" + device + "}"
}

// AllowClassAt decides whether device may publish a message of size
// payload bytes in topic class class ("" for the device's own quota)
// under q, of one window or several (messages or bytes), and counts it
// in every one of the class's shared windows when all admit it: the
// decision contract of devicelimit.Table's AllowClassAt, atomic inside
// Redis.
func (l *Limiter) AllowClassAt(device, class string, q devicelimit.Quota, size int, now devicelimit.Tick) devicelimit.Decision {
	if class == "" && q.NWindows == 0 {
		return l.AllowAt(device, q, now)
	}
	return l.decide(device, class, q.Limits(), size, now)
}

// AllowAt decides whether device may publish one message under quota q,
// of one message window, and counts it in the shared window when
// allowed. An invalid quota is refused, as by devicelimit.Table.
//
// A look without counting is Peek: it asks Redis and returns its error,
// where a decision takes the failure policy's answer.
func (l *Limiter) AllowAt(device string, q devicelimit.Quota, now devicelimit.Tick) devicelimit.Decision {
	one := [1]devicelimit.Limit{{Unit: devicelimit.Messages, N: q.Limit, Window: q.Window}}
	return l.decide(device, "", one[:], 0, now)
}

// decide is AllowClassAt for the windows ls.
func (l *Limiter) decide(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) devicelimit.Decision {
	if d, done := l.precheck(ls, size); done {
		return d
	}
	return l.decideVerdict(device, class, ls, size, now).Decision()
}

// decideVerdict decides the valid windows ls of key (a device, or a
// group's key: the script's key is its own hash tag) in class, or by
// the failure policy.
func (l *Limiter) decideVerdict(key, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) devicelimit.Verdict {
	if l.health.skip() {
		return policyVerdict(l.fallback(key, class, ls, size, now), len(ls))
	}
	r := l.pool.Get().(*request)
	l.fill(r, key, class, ls, size, true)
	if !l.send(r, key) {
		return policyVerdict(l.fallback(key, class, ls, size, now), len(ls))
	}
	v := r.res
	l.pool.Put(r)
	return v
}

// policyVerdict is a failure policy's decision d on n windows as a
// verdict.
func policyVerdict(d devicelimit.Decision, n int) devicelimit.Verdict {
	v := devicelimit.Verdict{Allowed: d.Allowed, RetryAfter: d.RetryAfter, Refused: 0, N: n}
	v.Windows[0] = d
	if d.Allowed {
		v.Refused = -1
	}
	return v
}

// precheck decides without Redis what needs none: windows a table
// would refuse as invalid, and a message larger than a byte window.
func (l *Limiter) precheck(ls []devicelimit.Limit, size int) (devicelimit.Decision, bool) {
	if len(ls) < 1 || len(ls) > devicelimit.MaxWindows {
		return devicelimit.Decision{}, true
	}
	for _, w := range ls {
		top := devicelimit.MaxLimit
		if w.Unit == devicelimit.Bytes {
			top = devicelimit.MaxBytes
		}
		if w.N < 1 || w.N > top || w.Window < time.Duration(l.buckets)*devicelimit.MinBucketWidth || w.Window > devicelimit.MaxWindow || w.Unit > devicelimit.Bytes {
			return devicelimit.Decision{Limit: w.N}, true
		}
	}
	if v, ok := devicelimit.TooLargeVerdict(ls, size); ok {
		return v.Decision(), true // no retry admits it: Redis need not be asked
	}
	return devicelimit.Decision{}, false
}

// send takes the decision r was filled for: with a call of its own when
// it is the only one under way, else through a pipeline worker. It
// reports whether r holds Redis's answer (the caller then returns r to
// the pool); on false, the failure is recorded and r is gone, and the
// caller decides by the failure policy.
func (l *Limiter) send(r *request, device string) bool {
	r.state.Store(pending)
	defer l.inflight.Add(-1)
	if l.inflight.Add(1) == 1 {
		return l.direct(r, device)
	}
	r.timer.Reset(l.timeout)
	select {
	case l.reqs <- r:
	case <-r.timer.C:
		l.health.failed(ErrTimeout)
		return false
	}
	select {
	case <-r.done:
		r.timer.Stop()
		if r.err != nil {
			l.failed(device, r.err)
			l.pool.Put(r)
			return false
		}
		l.health.ok()
		return true
	case <-r.timer.C:
		r.state.CompareAndSwap(pending, abandoned)
		l.health.failed(ErrTimeout)
		return false
	}
}

// fill sets r's keys and arguments to decide ls of class for a message
// of size bytes, counting it when count is set: a decision of one part.
// The group value is set by whoever sends r (a call's consecutive
// decisions need distinct ones).
func (l *Limiter) fill(r *request, device, class string, ls []devicelimit.Limit, size int, count bool) {
	r.reset()
	l.fillPart(r, l.windowKey(device), class, ls, size, count, 0)
	r.na = r.n
	copy(r.ls[:], ls)
}

// reset empties r's keys and parts for the next decision: a pooled
// request carries nothing over.
func (r *request) reset() {
	r.n, r.na, r.cond, r.groupFirst, r.tooLarge, r.second = 0, 0, false, false, false, devicelimit.Verdict{}
}

// fillPart appends to r the keys and arguments of the windows ls of
// class under base, with group value g.
func (l *Limiter) fillPart(r *request, base, class string, ls []devicelimit.Limit, size int, count bool, g int) {
	var c any = "0" // constants: boxed without an allocation
	if count {
		c = "1"
	}
	var seen [2]int
	for _, w := range ls {
		i := r.n
		r.keys[i] = windowKeyOf(base, class, w.Unit, seen[w.Unit])
		seen[w.Unit]++
		a := r.args[6*i : 6*i+6]
		a[0], a[1], a[2], a[3], a[4], a[5] = w.N, int64(w.Window/time.Microsecond), l.buckets, c, w.Units(size), g
		r.n++
	}
}

// setGroups sets the group values of r's keys for a call in which r is
// decision i: the first part's i, the second's i too when the parts are
// decided together, -(i+1) when the second is decided only if the
// first admitted (the script's conditional group).
func (r *request) setGroups(i int) {
	for k := range r.n {
		g := i
		if k >= r.na && r.cond {
			g = -(i + 1)
		}
		r.args[6*k+5] = g
	}
}

// decode reads the script's answer for r into r.res (and r.gres for a
// group decision).
func (r *request) decode(v []int64) error {
	if len(v) != 4*r.n {
		return errBadReply
	}
	na, nb := r.na, r.n-r.na
	first, second := r.ls[:na], r.gls[:nb]
	if r.groupFirst {
		first, second = r.gls[:na], r.ls[:nb]
	}
	a, err := decodeVerdict(v[:4*na], first)
	if err != nil {
		return err
	}
	var b devicelimit.Verdict
	switch {
	case r.tooLarge && a.Allowed:
		b = r.second
	case nb > 0 && (a.Allowed || !r.cond):
		if b, err = decodeVerdict(v[4*na:], second); err != nil {
			return err
		}
	}
	r.res, r.gres = a, b
	if r.groupFirst {
		r.res, r.gres = b, a
	}
	return nil
}

// windowKeyOf returns the Redis key of a device's window number k of
// unit u in class, base being the device's key: the table's window key
// (devicelimit.AppendWindowKey) with base in place of the device ID, so
// the one-window key is the one a gateway that knew one window per
// device used, and all of a device's keys share its hash tag.
func windowKeyOf(base, class string, u devicelimit.Unit, k int) string {
	if devicelimit.OwnWindow(class, u, k) {
		return base
	}
	return string(devicelimit.AppendWindowKey(make([]byte, 0, len(base)+len(class)+4), base, class, u, k))
}

// Reset empties the device's shared windows, those of its own quota
// and those of the topic classes named, and reports whether it had
// one.
func (l *Limiter) Reset(ctx context.Context, device string, classes []string) (bool, error) {
	return l.del(ctx, device, append([]string{""}, classes...))
}

// ResetClass empties the device's windows of one class, in Redis and
// in this gateway's own table (the failure policy local decides on
// it): the refusals counted toward a block, when the block is lifted.
func (l *Limiter) ResetClass(device, class string) error {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	for u := range devicelimit.Bytes + 1 {
		for k := range devicelimit.MaxWindows {
			l.local.Reset(string(devicelimit.AppendWindowKey(nil, device, class, u, k)))
		}
	}
	_, err := l.del(ctx, device, []string{class})
	return err
}

// del deletes the device's shared windows of the classes named and
// reports whether it had one.
func (l *Limiter) del(ctx context.Context, device string, classes []string) (bool, error) {
	base := l.windowKey(device)
	keys := make([]string, 0, 2*devicelimit.MaxWindows*len(classes))
	for _, class := range classes {
		for u := range devicelimit.Bytes + 1 {
			for k := range devicelimit.MaxWindows {
				keys = append(keys, windowKeyOf(base, class, u, k))
			}
		}
	}
	n, err := l.rdb.Del(ctx, keys...).Result()
	if err != nil {
		return false, fmt.Errorf("reset windows of %q: %w", device, err)
	}
	return n > 0, nil
}

const (
	pending   uint32 = iota
	taken            // a worker sends it
	abandoned        // its caller stopped waiting first
)

// request is one decision on its way through a pipeline. Requests are
// pooled; one whose caller gave up is left to the garbage collector,
// since its worker may still write to it.
type request struct {
	keys [2 * devicelimit.MaxWindows]string
	args [6 * 2 * devicelimit.MaxWindows]any
	ls   [devicelimit.MaxWindows]devicelimit.Limit // the device's windows
	gls  [devicelimit.MaxWindows]devicelimit.Limit // its group's (groups.go)
	n    int                                       // keys
	// na is the number of keys of the first part; the rest are the
	// second's (a group decision). cond: the second is decided only
	// when the first admits; groupFirst: the group's part is first.
	// tooLarge, when set, is the second part's verdict, decided without
	// Redis (a message too large for one of its byte windows).
	na                         int
	cond, groupFirst, tooLarge bool
	second                     devicelimit.Verdict
	state                      atomic.Uint32
	res, gres                  devicelimit.Verdict // the device's verdict, and its group's
	err                        error
	done                       chan struct{} // capacity 1, signalled once the result is set
	timer                      *time.Timer
}

// failed records a decision Redis did not take. An unreadable record
// is the device's problem alone: Redis answered.
func (l *Limiter) failed(device string, err error) {
	if errors.Is(err, ErrBadWindow) {
		l.health.badWindow(device, l.windowKey(device))
		return
	}
	l.health.failed(err)
}

// direct takes r's decision with a call of its own (see send).
func (l *Limiter) direct(r *request, device string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	r.setGroups(0)
	v, err := windowScript.Run(ctx, l.rdb, r.keys[:r.n], r.args[:6*r.n]...).Int64Slice() // EVALSHA, EVAL on NOSCRIPT
	if err == nil {
		err = r.decode(v)
	}
	if err != nil {
		l.pool.Put(r)
		l.failed(device, err)
		return false
	}
	l.health.ok()
	return true
}

// worker sends the decisions waiting in reqs, as many as are there (up
// to maxBatch), in one pipeline.
func (l *Limiter) worker() {
	defer l.wg.Done()
	batch := make([]*request, 0, maxBatch)
	var buf batchBuf
	for {
		select {
		case r := <-l.reqs:
			batch = append(batch[:0], r)
		case <-l.stop:
			return
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-l.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		l.run(batch, &buf)
	}
}

// batchBuf holds a worker's keys and arguments of one script call for
// many decisions, reused from batch to batch.
type batchBuf struct {
	keys []string
	args []any
}

// run sends batch in one pipeline and hands out the results.
func (l *Limiter) run(batch []*request, buf *batchBuf) {
	live := batch[:0]
	for _, r := range batch {
		if r.state.CompareAndSwap(pending, taken) {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	if l.multi {
		l.runMulti(ctx, live, buf)
		return
	}
	cmds := l.eval(ctx, live, false)
	// A node that restarted or flushed its scripts answers NOSCRIPT (on
	// Redis Cluster, maybe only some nodes): EVAL loads it again there.
	var again []*request
	var at []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && isNoScript(err) {
			again, at = append(again, live[i]), append(at, i)
		}
	}
	if len(again) > 0 {
		for k, cmd := range l.eval(ctx, again, true) {
			cmds[at[k]] = cmd
		}
	}
	for i, r := range live {
		var v []int64
		if v, r.err = cmds[i].Int64Slice(); r.err == nil {
			r.err = r.decode(v)
		}
		r.done <- struct{}{}
	}
}

// runMulti decides the whole batch in one script call, each request's
// windows a group of their own.
func (l *Limiter) runMulti(ctx context.Context, live []*request, buf *batchBuf) {
	buf.keys, buf.args = buf.keys[:0], buf.args[:0]
	for i, r := range live {
		buf.keys = append(buf.keys, r.keys[:r.n]...)
		r.setGroups(i)
		buf.args = append(buf.args, r.args[:6*r.n]...)
	}
	v, err := windowScript.Run(ctx, l.rdb, buf.keys, buf.args...).Int64Slice() // EVALSHA, EVAL on NOSCRIPT
	if err == nil && len(v) != 4*len(buf.keys) {
		err = errBadReply
	}
	at := 0
	for _, r := range live {
		if r.err = err; err == nil {
			r.err = r.decode(v[4*at : 4*(at+r.n)])
		}
		at += r.n
		r.done <- struct{}{}
	}
	clear(buf.args) // drop the references to the requests' values
}

func (l *Limiter) eval(ctx context.Context, live []*request, full bool) []*redis.Cmd {
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(live))
	for i, r := range live {
		r.setGroups(0)
		if full {
			cmds[i] = windowScript.Eval(ctx, pipe, r.keys[:r.n], r.args[:6*r.n]...)
		} else {
			cmds[i] = windowScript.EvalSha(ctx, pipe, r.keys[:r.n], r.args[:6*r.n]...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	return cmds
}

func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

var errBadReply = errors.New("window script: unexpected reply")

// decodeResult reads one window's decision of the script's reply:
// allowed, count, remaining, retry-after in microseconds.
func decodeResult(v []int64) (devicelimit.Decision, error) {
	if len(v) != 4 {
		return devicelimit.Decision{}, errBadReply
	}
	if v[0] == -1 {
		return devicelimit.Decision{}, ErrBadWindow
	}
	return devicelimit.Decision{Allowed: v[0] == 1, Count: int(v[1]), Remaining: int(v[2]), RetryAfter: time.Duration(v[3]) * time.Microsecond}, nil
}

// decodeVerdict reads the decision on the windows ls, as
// devicelimit.Table.AllowAllAt reports it: allowed when no window
// refused, and then the refusing window that admits last.
func decodeVerdict(v []int64, ls []devicelimit.Limit) (devicelimit.Verdict, error) {
	out := devicelimit.Verdict{N: len(ls)}
	if len(v) != 4*len(ls) {
		return out, errBadReply
	}
	for i, w := range ls {
		d, err := decodeResult(v[4*i : 4*i+4])
		if err != nil {
			return out, err
		}
		d.Limit, d.Unit = w.N, w.Unit
		out.Windows[i] = d
		if d.RetryAfter > 0 && d.RetryAfter >= out.RetryAfter {
			out.RetryAfter, out.Refused = d.RetryAfter, i
		}
	}
	if out.RetryAfter == 0 {
		out.Allowed, out.Refused = true, -1
	}
	return out, nil
}

// Peek returns the decision a publish would get on the device's shared
// window of a one-window quota, without counting it.
func (l *Limiter) Peek(ctx context.Context, device string, q devicelimit.Quota) (devicelimit.Decision, error) {
	if err := q.Validate(l.buckets); err != nil {
		return devicelimit.Decision{}, err
	}
	v, err := l.PeekAll(ctx, device, "", []devicelimit.Limit{{N: q.Limit, Window: q.Window}}, 0)
	d := v.Windows[0] // Allowed false, as devicelimit.Table.PeekAt's
	d.RetryAfter = v.RetryAfter
	return d, err
}

// PeekAll returns the verdict a message of size bytes would get on the
// device's shared windows ls of class, without counting it: the one
// look at shared windows. It asks Redis whatever its health and returns
// Redis's error instead of a failure policy's answer, and counts no
// fallback: for the admin API.
func (l *Limiter) PeekAll(ctx context.Context, device, class string, ls []devicelimit.Limit, size int) (devicelimit.Verdict, error) {
	if err := devicelimit.ValidateLimits(ls, l.buckets); err != nil {
		return devicelimit.Verdict{}, err
	}
	v, err := l.evalAllAt(ctx, device, class, ls, size, false, "")
	if err != nil {
		return v, fmt.Errorf("read windows of %q in redis: %w", device, err)
	}
	return v, nil
}

// evalAt runs one decision on a one-window quota synchronously at
// clock (see evalAllAt).
func (l *Limiter) evalAt(ctx context.Context, device string, q devicelimit.Quota, count bool, clock any) (devicelimit.Decision, error) {
	v, err := l.evalAllAt(ctx, device, "", []devicelimit.Limit{{N: q.Limit, Window: q.Window}}, 0, count, clock)
	if err != nil {
		return devicelimit.Decision{Limit: q.Limit}, err
	}
	d := v.Windows[0]
	d.RetryAfter = v.RetryAfter
	return d, nil
}

// evalAllAt runs one decision on the windows ls synchronously at clock,
// an explicit time in microseconds instead of Redis's TIME (for tests,
// which cannot move Redis's clock), or "" for Redis's TIME.
func (l *Limiter) evalAllAt(ctx context.Context, device, class string, ls []devicelimit.Limit, size int, count bool, clock any) (devicelimit.Verdict, error) {
	var r request
	l.fill(&r, device, class, ls, size, count)
	v, err := windowScript.Run(ctx, l.rdb, r.keys[:r.n], append(r.args[:6*r.n:6*r.n], clock)...).Int64Slice()
	if err != nil {
		return devicelimit.Verdict{}, err
	}
	return decodeVerdict(v, ls)
}

// Close stops the pipeline workers: a decision after Close may wait up
// to Timeout and take the failure policy. It does not close the Client.
func (l *Limiter) Close() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}
