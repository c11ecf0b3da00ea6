package broker

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// Automatic blocking: a device a quota with a Block refused Block.After
// times within Block.Within is disconnected and its CONNECTs are refused
// until the block's end. Blocks persist in a BlockStore when there is
// one, expire by themselves, and can be lifted (Server.Unblock).

// BlockStore keeps blocks durably (a *persist.Store is one): each
// with its start, its end and its reason.
type BlockStore interface {
	SetBlock(device string, since, until devicelimit.Tick, reason string) error
	DeleteBlock(device string) error
	// LoadBlocks calls fn for each stored block; since is 0 and reason
	// "" for a block stored without them.
	LoadBlocks(fn func(device string, since, until devicelimit.Tick, reason string) error) error
}

// SharedBlocks, when a BlockStore also implements it, are the blocks
// of the gateways sharing windows (cluster mode): asked at every CONNECT
// of a device, they are the truth while they answer (a block made or
// lifted on another gateway counts here at once); this gateway's own
// blocks decide while they do not.
type SharedBlocks interface {
	// BlockedUntil returns the end of device's shared block (ok false:
	// none), or an error when they cannot be read.
	BlockedUntil(device string) (until devicelimit.Tick, ok bool, err error)
}

// Blocked is a device's block: in force from Since until Until, for
// Reason ("3 refusals over quota within 1m0s (quota: 10 messages per
// 1m0s)"). Since is 0 and Reason "" for a block stored by a gateway
// that did not record them.
type Blocked struct {
	Device string
	Until  devicelimit.Tick
	Since  devicelimit.Tick
	Reason string
}

// block is a block in force: its start, end and reason.
type block struct {
	since, until devicelimit.Tick
	reason       string
}

// refusalsClass is the class under which a device's refusals are
// counted for blocking: a NUL in it keeps it apart from every topic
// class (a class's name holds none).
const refusalsClass = "\x00refusals"

type blocks struct {
	mu     sync.Mutex
	m      map[string]block
	n      atomic.Int64 // len(m), so the common case takes no lock
	store  BlockStore   // nil: blocks last until the process ends
	shared SharedBlocks // the store's, in cluster mode; else nil
	// mayBlock reports whether any quota has a block: until one has, a
	// CONNECT does not ask the shared blocks (a Redis round trip).
	mayBlock func() bool
	log      *slog.Logger

	made atomic.Uint64 // blocks made
}

func newBlocks(store BlockStore, mayBlock func() bool, log *slog.Logger) *blocks {
	b := &blocks{m: make(map[string]block), store: store, mayBlock: mayBlock, log: log}
	b.shared, _ = store.(SharedBlocks)
	return b
}

// load restores the stored blocks still in force at now.
func (b *blocks) load(now devicelimit.Tick) error {
	if b.store == nil {
		return nil
	}
	var gone []string
	err := b.store.LoadBlocks(func(device string, since, until devicelimit.Tick, reason string) error {
		if until <= now {
			gone = append(gone, strings.Clone(device))
			return nil
		}
		b.mu.Lock()
		b.m[strings.Clone(device)] = block{since: since, until: until, reason: strings.Clone(reason)}
		b.n.Store(int64(len(b.m)))
		b.mu.Unlock()
		return nil
	})
	if err != nil {
		return fmt.Errorf("restore blocks: %w", err)
	}
	for _, d := range gone {
		if err := b.store.DeleteBlock(d); err != nil {
			return fmt.Errorf("delete expired block of %q: %w", d, err)
		}
	}
	return nil
}

// until returns the end of device's block in force at now.
func (b *blocks) until(device string, now devicelimit.Tick) (devicelimit.Tick, bool) {
	if b.shared != nil && b.mayBlock() {
		u, ok, err := b.shared.BlockedUntil(device)
		if err == nil {
			return u, ok && now < u
		}
		// Unread: this gateway's own blocks decide.
	}
	if b.n.Load() == 0 {
		return 0, false
	}
	b.mu.Lock()
	x, ok := b.m[device]
	b.mu.Unlock()
	return x.until, ok && now < x.until
}

// get returns device's block in force at now as this gateway knows it:
// its own, whose end the shared blocks (cluster mode) correct while
// they answer; a block made by another gateway (another end than this
// gateway's) has no start or reason here.
func (b *blocks) get(device string, now devicelimit.Tick) (Blocked, bool) {
	u, ok := b.until(device, now)
	if !ok {
		return Blocked{}, false
	}
	b.mu.Lock()
	x, mine := b.m[device]
	b.mu.Unlock()
	out := Blocked{Device: device, Until: u}
	if mine && x.until == u {
		out.Since, out.Reason = x.since, x.reason
	}
	return out, true
}

// block blocks device from now until until for reason and reports
// whether it is a new block (false: it was blocked already). The block
// is stored before it is reported.
func (b *blocks) block(device string, until devicelimit.Tick, reason string, now devicelimit.Tick) (bool, error) {
	// In a cluster the shared blocks are the truth while they answer: a
	// block of this gateway's that another gateway lifted is no block.
	liftedElsewhere := false
	if b.shared != nil {
		su, sok, err := b.shared.BlockedUntil(device)
		liftedElsewhere = err == nil && (!sok || su <= now)
	}
	b.mu.Lock()
	if x, ok := b.m[device]; ok && now < x.until && !liftedElsewhere {
		b.mu.Unlock()
		return false, nil
	}
	b.m[device] = block{since: now, until: until, reason: reason}
	b.n.Store(int64(len(b.m)))
	b.mu.Unlock()
	b.made.Add(1)
	if b.store != nil {
		if err := b.store.SetBlock(device, now, until, reason); err != nil {
			return true, fmt.Errorf("store the block of %q: %w", device, err)
		}
	}
	return true, nil
}

// lift ends device's block, reporting whether it had one in force.
func (b *blocks) lift(device string, now devicelimit.Tick) (bool, error) {
	b.mu.Lock()
	x, ok := b.m[device]
	u := x.until
	delete(b.m, device)
	b.n.Store(int64(len(b.m)))
	b.mu.Unlock()
	if b.shared != nil {
		// A block made by another gateway is lifted here too.
		if su, sok, err := b.shared.BlockedUntil(device); err == nil && sok {
			u, ok = su, true
		}
	}
	if !ok {
		return false, nil
	}
	if b.store != nil {
		if err := b.store.DeleteBlock(device); err != nil {
			return now < u, fmt.Errorf("delete the block of %q: %w", device, err)
		}
	}
	if now < u {
		b.log.Info("device unblocked", "device", device, "reason", "lifted through the admin API")
		return true, nil
	}
	return false, nil
}

// expire ends the blocks over at now, logging each once.
func (b *blocks) expire(now devicelimit.Tick) {
	if b.n.Load() == 0 {
		return
	}
	var over []string
	b.mu.Lock()
	for d, x := range b.m {
		if x.until <= now {
			over = append(over, d)
			delete(b.m, d)
		}
	}
	b.n.Store(int64(len(b.m)))
	b.mu.Unlock()
	for _, d := range over {
		b.log.Info("device unblocked", "device", d, "reason", "the block ended")
		if b.store != nil {
			if err := b.store.DeleteBlock(d); err != nil {
				b.log.Error("expired block not deleted from the data file", "device", d, "error", err)
			}
		}
	}
}

// list returns the blocks in force at now, by device.
func (b *blocks) list(now devicelimit.Tick) []Blocked {
	b.mu.Lock()
	out := make([]Blocked, 0, len(b.m))
	for d, x := range b.m {
		if now < x.until {
			out = append(out, Blocked{Device: d, Until: x.until, Since: x.since, Reason: x.reason})
		}
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(x, y Blocked) int { return strings.Compare(x.Device, y.Device) })
	return out
}

// countRefusal counts a refusal of the device's message of size bytes
// under q (of topic class class) and reports whether it is the
// q.Block.After-th within q.Block.Within: the device is to be blocked.
// The refusals are counted in a window of the device's own, through the
// limiter (shared in Redis in cluster mode). A refusal the crash charge
// alone caused (chargedRefusals) is not counted: a crash never blocks
// a device that was calm before it.
func (h *throttle) countRefusal(c *connInfo, class string, q devicelimit.Quota, size int, now devicelimit.Tick) bool {
	if cr, ok := h.limiter.(chargedRefusals); ok && cr.ChargedAt(c.device, class, q, size, now) {
		return false
	}
	b := q.Block
	d := h.limiter.AllowClassAt(c.device, refusalsClass, devicelimit.Quota{Limit: b.After, Window: b.Within}, 0, now)
	return !d.Allowed || d.Remaining == 0
}

// chargedRefusals is a limiter that tells a refusal caused only by what
// a crash charged (devicelimit.Table's ChargedAt).
type chargedRefusals interface {
	ChargedAt(device, class string, q devicelimit.Quota, size int, now devicelimit.Tick) bool
}

// classResetter is a limiter that empties one class of a device's
// windows itself (cluster.Limiter: in Redis and in its own table).
type classResetter interface {
	ResetClass(device, class string) error
}

// forgetRefusals empties the device's window of refusals toward a
// block: in the limiter's table, and in Redis in cluster mode.
func (h *throttle) forgetRefusals(device string) error {
	switch l := h.limiter.(type) {
	case classResetter:
		if err := l.ResetClass(device, refusalsClass); err != nil {
			return fmt.Errorf("forget the refusals of %q: %w", device, err)
		}
	case *devicelimit.Table:
		l.Reset(string(devicelimit.AppendWindowKey(nil, device, refusalsClass, devicelimit.Messages, 0)))
	}
	return nil
}

// blockReason is why a device the quota q (of topic class class, ""
// for the device's own) refused is blocked: "3 refusals over quota
// within 1m0s (quota: 10 messages per 1m0s)".
func blockReason(q devicelimit.Quota, class string) string {
	of := "quota"
	if class != "" {
		of = "topic class " + class
	}
	return fmt.Sprintf("%d refusals over quota within %s (%s: %s)", q.Block.After, q.Block.Within, of, q.Describe())
}

// blockNow blocks the device for q.Block.For (q the quota of class that
// refused it), logs it once, and disconnects the connection (MQTT 5:
// DISCONNECT 0x98, administrative action, with a reason string; 3.1.1
// has no server DISCONNECT: the connection ends).
func (h *throttle) blockNow(cl *mqtt.Client, c *connInfo, q devicelimit.Quota, class string, now devicelimit.Tick) error {
	until := now.Add(q.Block.For)
	why := blockReason(q, class)
	reason := fmt.Sprintf("blocked for %s: %d refusals over quota within %s", q.Block.For, q.Block.After, q.Block.Within)
	fresh, err := h.blocks.block(c.device, until, why, now)
	if err != nil {
		h.log.Error("block not stored: it lasts until the gateway stops", "device", c.device, "error", err)
	}
	if fresh {
		h.log.Warn("device blocked", "device", c.device, "client", cl.ID, "until", until.Time().UTC().Format(time.RFC3339), "reason", why)
	}
	return h.disconnect(cl, c, packets.ErrAdministrativeAction.Code, reason)
}
