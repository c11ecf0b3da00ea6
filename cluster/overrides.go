package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/devicelimit"
)

// Overrides keeps runtime quota overrides in Redis, shared by every
// gateway: one hash (device → record) and a pub/sub channel that names
// the device of each change. Each gateway mirrors the hash in its own
// Resolver: a change made through any gateway's admin API is in force
// on every gateway from the device's next message after the
// notification arrives (normally a millisecond or so). After a lost
// connection to Redis the whole hash is read again, so changes missed
// meanwhile are not lost. It implements admin.Overrides. Use
// NewOverrides, then Start; Close stops it. Safe for concurrent use.
type Overrides struct {
	rdb      redis.UniversalClient
	resolver *devicelimit.Resolver
	clock    devicelimit.Clock
	log      *slog.Logger
	hash     string
	channel  string

	// mu makes each change of the resolver follow a read of Redis made
	// under it: changes then land in the order of the reads, and the
	// last one holds what Redis holds (a gateway's own change included,
	// which would otherwise race with another gateway's told over
	// pub/sub).
	mu sync.Mutex
	// stored, when set (by tests), runs after a change is stored in
	// Redis, before it is put in force here.
	stored func(device string)

	sub    *redis.PubSub
	synced chan struct{} // closed after the first full read
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
}

// NewOverrides returns overrides shared through rdb (the control client
// of NewClients) and mirrored in resolver. prefix must be the Limiter's.
func NewOverrides(rdb redis.UniversalClient, resolver *devicelimit.Resolver, clock devicelimit.Clock, prefix string, log *slog.Logger) *Overrides {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Overrides{
		rdb: rdb, resolver: resolver, clock: clock, log: log,
		hash: prefix + "overrides", channel: prefix + "overrides:changed",
		synced: make(chan struct{}), done: make(chan struct{}),
	}
}

// Start subscribes to changes and starts mirroring. It returns without
// waiting for Redis; Synced tells when the first full read is done.
func (o *Overrides) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	o.sub = o.rdb.Subscribe(ctx, o.channel)
	go o.run(ctx)
}

// Synced is closed once the overrides in Redis have been read in full.
func (o *Overrides) Synced() <-chan struct{} { return o.synced }

// Close stops mirroring. Safe after Start only, once.
func (o *Overrides) Close() error {
	o.cancel()
	err := o.sub.Close()
	<-o.done
	return err
}

// run applies notifications. Each (re)subscription, the first one and
// those after a lost connection, starts with a full read. A read that
// fails while Redis answers (a full read, or one device's after its
// notification) is retried as a fresh subscription and full read, after
// a pause that grows to a second; failures are logged at most once every
// 10 s.
func (o *Overrides) run(ctx context.Context) {
	defer close(o.done)
	backoff := 50 * time.Millisecond
	var lastLog time.Time
	// pause logs err (rate-limited) and waits out the backoff; it reports
	// false when the overrides are closing.
	pause := func(msg string, err error) bool {
		if time.Since(lastLog) > 10*time.Second {
			o.log.Warn(msg, "err", err.Error())
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff): // retry pause, not a test sleep
		}
		backoff = min(2*backoff, time.Second)
		return true
	}
	resync := func(msg string, err error) bool {
		if !pause(msg, err) {
			return false
		}
		_ = o.sub.Unsubscribe(ctx, o.channel) // resubscribe: a fresh full read
		_ = o.sub.Subscribe(ctx, o.channel)
		return true
	}
	for {
		msg, err := o.sub.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if !pause("quota override notifications from redis interrupted; retrying", err) {
				return
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				if err := o.sync(ctx); err != nil {
					if !resync("quota overrides not read from redis; retrying", err) {
						return
					}
					continue
				}
				backoff = 50 * time.Millisecond
				o.once.Do(func() { close(o.synced) })
			}
		case *redis.Message:
			if err := o.apply(ctx, m.Payload); err != nil {
				err = fmt.Errorf("device %q: %w", m.Payload, err)
				if !resync("quota override change not read from redis; reading them all again", err) {
					return
				}
			}
		}
	}
}

// sync makes the resolver's overrides those of the hash.
func (o *Overrides) sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	o.mu.Lock()
	defer o.mu.Unlock()
	all, err := o.rdb.HGetAll(ctx, o.hash).Result()
	if err != nil {
		return fmt.Errorf("read %s: %w", o.hash, err)
	}
	now := o.clock.Now()
	var expired []string
	for device, rec := range all {
		if ov, err := decodeOverride(rec); err == nil && ov.Expired(now) {
			expired = append(expired, device)
			delete(all, device)
			continue
		}
		o.set(device, rec)
	}
	if len(expired) > 0 {
		// Lapsed everywhere: without this the hash would only grow.
		// Best effort; the next full read tries again.
		_ = o.rdb.HDel(ctx, o.hash, expired...).Err()
	}
	for _, d := range o.resolver.Overrides(now) {
		if _, ok := all[d.Device]; !ok {
			o.resolver.DeleteOverride(d.Device)
		}
	}
	o.log.Info("quota overrides read from redis", "overrides", len(all))
	return nil
}

// apply re-reads one device's override after a notification or a
// change made here.
func (o *Overrides) apply(ctx context.Context, device string) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	o.mu.Lock()
	defer o.mu.Unlock()
	rec, err := o.rdb.HGet(ctx, o.hash, device).Result()
	switch {
	case errors.Is(err, redis.Nil):
		o.resolver.DeleteOverride(device)
		return nil
	case err != nil:
		return err
	}
	o.set(device, rec)
	return nil
}

func (o *Overrides) set(device, rec string) {
	ov, err := decodeOverride(rec)
	if err == nil {
		err = o.resolver.SetOverride(device, ov)
	}
	if err != nil {
		o.log.Warn("quota override in redis ignored", "device", device, "err", err.Error())
	}
}

// SetOverride validates ov, stores it in Redis, notifies every gateway
// and puts it in force here. Bad input wraps devicelimit's sentinels and
// changes nothing.
func (o *Overrides) SetOverride(device string, ov devicelimit.Override) error {
	if err := ov.Validate(device, o.resolver.Buckets()); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	if _, err := o.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, o.hash, device, encodeOverride(ov))
		p.Publish(ctx, o.channel, device)
		return nil
	}); err != nil {
		return fmt.Errorf("store override of %q in redis: %w", device, err)
	}
	o.inForce(ctx, device)
	return nil
}

// inForce puts a change made here in force at once: what Redis holds
// now, which may already be a later change by another gateway. Should
// that read fail, the change's own notification brings it.
func (o *Overrides) inForce(ctx context.Context, device string) {
	if o.stored != nil {
		o.stored(device)
	}
	_ = o.apply(ctx, device)
}

// DeleteOverride removes the device's override from Redis, notifies
// every gateway, and reports whether there was one.
func (o *Overrides) DeleteOverride(device string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	var del *redis.IntCmd
	if _, err := o.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		del = p.HDel(ctx, o.hash, device)
		p.Publish(ctx, o.channel, device)
		return nil
	}); err != nil {
		return false, fmt.Errorf("delete override of %q in redis: %w", device, err)
	}
	o.inForce(ctx, device)
	return del.Val() > 0, nil
}

// encodeOverride writes "v1 LIMIT WINDOW_NS POLICY EXPIRES_NS" for a
// quota of one window, and "v2 POLICY EXPIRES_NS WINDOWS" for one of
// several, WINDOWS being "UNIT:N:WINDOW_NS" for each, comma-separated,
// UNIT m (messages) or b (bytes); an override with topic classes is
// "v3 " and its JSON form (devicelimit.MarshalOverride). A gateway that knows only v1 reads a
// v2 record as unreadable (logged) and keeps the device on its rules.
func encodeOverride(ov devicelimit.Override) string {
	if ov.NeedsJSON() {
		return "v3 " + string(devicelimit.MarshalOverride(ov))
	}
	q := ov.Quota
	if q.NWindows == 0 {
		return fmt.Sprintf("v1 %d %d %s %d", q.Limit, int64(q.Window), q.Policy, int64(ov.ExpiresAt))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "v2 %s %d ", q.Policy, int64(ov.ExpiresAt))
	for i, l := range q.Windows[:q.NWindows] {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%c:%d:%d", "mb"[l.Unit], l.N, int64(l.Window))
	}
	return b.String()
}

// decodeOverride reads encodeOverride's formats; anything else is an
// error wrapping ErrBadOverride.
func decodeOverride(s string) (devicelimit.Override, error) {
	if rest, ok := strings.CutPrefix(s, "v3 "); ok {
		o, err := devicelimit.UnmarshalOverride([]byte(rest))
		if err == nil && !o.NeedsJSON() {
			err = errors.New("neither classes nor shadow mode")
		}
		if err != nil {
			return devicelimit.Override{}, fmt.Errorf("%w: %q: %v", ErrBadOverride, trim(s), err)
		}
		return o, nil
	}
	f := strings.Split(s, " ")
	bad := func(err error) (devicelimit.Override, error) {
		if err == nil {
			return devicelimit.Override{}, fmt.Errorf("%w: %q", ErrBadOverride, trim(s))
		}
		return devicelimit.Override{}, fmt.Errorf("%w: %q: %v", ErrBadOverride, trim(s), err)
	}
	switch {
	case len(f) == 5 && f[0] == "v1":
		limit, err1 := strconv.Atoi(f[1])
		window, err2 := strconv.ParseInt(f[2], 10, 64)
		policy, err3 := devicelimit.ParsePolicy(f[3])
		expires, err4 := strconv.ParseInt(f[4], 10, 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return bad(err)
		}
		return devicelimit.Override{
			Quota:     devicelimit.Quota{Limit: limit, Window: time.Duration(window), Policy: policy},
			ExpiresAt: devicelimit.Tick(expires),
		}, nil
	case len(f) == 4 && f[0] == "v2":
		policy, err1 := devicelimit.ParsePolicy(f[1])
		expires, err2 := strconv.ParseInt(f[2], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return bad(err)
		}
		ws := strings.Split(f[3], ",")
		if len(ws) > devicelimit.MaxWindows {
			return bad(fmt.Errorf("%d windows", len(ws)))
		}
		var ls []devicelimit.Limit
		for _, w := range ws {
			unit, rest, ok1 := strings.Cut(w, ":")
			n, window, ok2 := strings.Cut(rest, ":")
			limit, err1 := strconv.Atoi(n)
			length, err2 := strconv.ParseInt(window, 10, 64)
			if !ok1 || !ok2 || (unit != "m" && unit != "b") {
				return bad(fmt.Errorf("window %q", w))
			}
			if err := errors.Join(err1, err2); err != nil {
				return bad(err)
			}
			u := devicelimit.Messages
			if unit == "b" {
				u = devicelimit.Bytes
			}
			ls = append(ls, devicelimit.Limit{Unit: u, N: limit, Window: time.Duration(length)})
		}
		return devicelimit.Override{Quota: devicelimit.WithWindows(policy, ls...), ExpiresAt: devicelimit.Tick(expires)}, nil
	}
	return bad(nil)
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
