package broker

// Presence and housekeeping: which devices are connected and when each
// last published (for the admin API's device status), the throttle's
// per-connection cache, and the periodic sweep. Throttling itself is in
// throttle.go.

import (
	"slices"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/devicelimit"
)

// DeviceStatus is what the broker knows of one device now.
type DeviceStatus struct {
	// Connected reports whether the device has a live connection.
	Connected bool
	// ClientID and Username are those of the device's latest live
	// connection; empty when it has none.
	ClientID, Username string
	// LastSeen is the decision instant of the device's latest publish
	// (admitted, refused or deferred) on the clock of Options.Clock,
	// remembered for lastSeenRetention after its last connection ends;
	// 0 when unknown (no publish since start, or forgotten).
	LastSeen devicelimit.Tick
	// Deferred is the number of the device's messages in the deferral
	// queue; always 0 without a DeferStore.
	Deferred int
	// BlockedUntil is the end of the device's block; 0 when it is not
	// blocked.
	BlockedUntil devicelimit.Tick
	// Remote, Protocol and Since are the latest live connection's
	// remote address, MQTT protocol version (4: 3.1.1, 5) and start;
	// zero when the device has none.
	Remote   string
	Protocol byte
	Since    devicelimit.Tick
}

// lastSeenRetention is how long LastSeen is remembered for a device with
// no live connection; sweep forgets it after that, bounding the memory
// to the devices seen in that time.
const lastSeenRetention = 24 * time.Hour

// devState is one device's live connections and last publish.
type devState struct {
	live []*connInfo // in establishment order; guarded by devMu
	// lastSeen is the Tick of the latest publish decided. Written on
	// every publish without devMu.
	lastSeen atomic.Int64
	history  history
	// series is its outcomes over time (series.go).
	series *series
}

// status returns what d holds of the device's status; Deferred and
// BlockedUntil are left 0. The caller holds devMu.
func (d *devState) status() DeviceStatus {
	st := DeviceStatus{LastSeen: devicelimit.Tick(d.lastSeen.Load())}
	if n := len(d.live); n > 0 {
		c := d.live[n-1]
		st.Connected, st.ClientID, st.Username = true, c.clientID, c.username
		st.Remote, st.Protocol, st.Since = c.remote, c.protocol, c.since
	}
	return st
}

// seen advances lastSeen to now; publishes on concurrent connections of
// one device may be decided out of order.
func (d *devState) seen(now devicelimit.Tick) {
	for {
		cur := d.lastSeen.Load()
		if int64(now) <= cur || d.lastSeen.CompareAndSwap(cur, int64(now)) {
			return
		}
	}
}

// OnSessionEstablish caches the connection's device and rule quota. It
// runs after authentication, so refused connections leave nothing behind.
func (h *throttle) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	gen := h.resolver.Generation()
	c := h.connInfo(cl)
	h.devMu.Lock()
	d := h.devices[c.device]
	if d == nil {
		d = &devState{series: newSeries()}
		h.devices[c.device] = d
	}
	d.live = append(d.live, c)
	c.dev = d
	h.devMu.Unlock()
	// A reload that put its rules in force (Generation changes after
	// that) between connInfo's lookup and the append walked the live
	// connections without c (Server.Reconfigure): look the rules up
	// again, until none came between a lookup and its store. A reload
	// after that finds c in its walk, and its store comes last.
	for now := h.resolver.Generation(); now != gen; now = h.resolver.Generation() {
		gen = now
		c.rv.Store(h.ruleView(c.clientID, c.username))
	}
	h.conns.setInfo(cl, c)
	h.connected.Add(1)
	if h.prelease && !h.consumers.rules.Load().matches(cl.ID) {
		if s := h.conns.session(cl); s == nil || s.role != auth.RoleConsumer {
			h.preleaseOf(c)
		}
	}
}

// preleaseOf asks the first leases of c's device's own windows as its
// session starts (not a backend consumer's: it subscribes) and waits,
// before mochi sends the CONNACK, until they are durable
// (devicelimit/prelease.go), so that its first publish finds them
// durable and its PUBACK waits for no disk commit: the connection pays
// that commit once, not its first publish. The windows of a topic
// class or a group are leased by their first admission, as before. A
// data file that does not record them within leaseWait lets the CONNACK
// go: the first publish then waits for its lease itself. The CONNACKs
// one commit lets go keep the spacing their connections asked with
// (cohort.go).
func (h *throttle) preleaseOf(c *connInfo) {
	v := c.rules()
	now := h.clock.Now()
	q, _, _ := h.resolver.ContractAt(c.device, v.rule, v.ruleName, v.classes, now)
	if gen := h.table.PreleaseQuota(c.device, q, now); gen != 0 {
		spacing := h.cohorts.offset(gen, time.Now())
		if h.table.WaitSessionLease(gen, leaseWait) && spacing > 0 {
			time.Sleep(spacing)
		}
	}
}

func (h *throttle) connInfo(cl *mqtt.Client) *connInfo {
	username := string(cl.Properties.Username)
	c := &connInfo{device: h.identity.Of(cl.ID, username), clientID: cl.ID, username: username,
		remote: cl.Net.Remote, protocol: cl.Properties.ProtocolVersion, since: h.clock.Now()}
	c.rv.Store(h.ruleView(cl.ID, username))
	if c.protocol == 5 {
		c.fb = new(feedbackState)
	}
	return c
}

// ruleView is what the configuration gives a connection's device.
type ruleView struct {
	rule     devicelimit.Quota   // the config rule (or default) quota
	ruleName string              // the rule's name; "" for the default
	classes  []devicelimit.Class // the rule's (or default's) topic classes
	group    groupOf             // the device's group; zero for none
	// wouldRefuse counts the rule's would-refuse messages.
	wouldRefuse *atomic.Uint64
}

// ruleView looks up the rule, classes and group of a client.
func (h *throttle) ruleView(clientID, username string) *ruleView {
	gen := h.resolver.Generation() // before the lookup: see joinGroup
	q, classes, src, m := h.resolver.RuleGroup(clientID, username)
	return &ruleView{rule: q, ruleName: src.Rule, classes: classes, group: h.joinGroup(m, gen), wouldRefuse: h.wouldRefuseOf(src.Rule)}
}

// rules returns what the configuration gives the connection's device
// now.
func (c *connInfo) rules() *ruleView { return c.rv.Load() }

// liveConn returns device's newest live connection (its rules looked
// up again at each reload), nil when it has none.
func (h *throttle) liveConn(device string) *connInfo {
	h.devMu.Lock()
	defer h.devMu.Unlock()
	if d := h.devices[device]; d != nil && len(d.live) > 0 {
		return d.live[len(d.live)-1]
	}
	return nil
}

// OnDisconnect forgets the connection. (mochi skips OnDisconnect when a
// CONNACK write fails; sweep removes those entries.)
func (h *throttle) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	h.forget(cl)
}

// forget removes cl from conns and from its device's live connections,
// once, whether OnDisconnect or sweep comes first.
func (h *throttle) forget(cl *mqtt.Client) {
	c, ok := h.conns.remove(cl)
	if !ok {
		return
	}
	if c == nil {
		return // authenticated, never established (its CONNACK failed)
	}
	c.ack.close()
	h.forgetSuback(c)
	h.connected.Add(-1)
	h.devMu.Lock()
	defer h.devMu.Unlock()
	d := c.dev
	if i := slices.Index(d.live, c); i >= 0 {
		d.live = slices.Delete(d.live, i, i+1)
	}
	if len(d.live) == 0 && d.lastSeen.Load() == 0 && h.devices[c.device] == d {
		delete(h.devices, c.device) // nothing to remember
	}
}

// status returns what the hook knows of device; Deferred is left 0.
func (h *throttle) status(device string) DeviceStatus {
	h.devMu.Lock()
	defer h.devMu.Unlock()
	d := h.devices[device]
	if d == nil {
		return DeviceStatus{}
	}
	return d.status()
}

// cachedInfo returns cl's cached connection info. When it is not cached
// (the session was swept as closed while this last packet was in
// flight) it is computed, and not cached for a dead client.
func (h *throttle) cachedInfo(cl *mqtt.Client) *connInfo {
	if c := h.conns.info(cl); c != nil {
		return c
	}
	return h.connInfo(cl)
}

// sweep evicts expired windows, log-limiter entries and overrides, and
// forgets connections closed without an OnDisconnect.
func (h *throttle) sweep(now devicelimit.Tick) {
	h.table.Sweep(now)
	h.logs.sweep(now)
	h.wills.sweep(now)
	for _, device := range h.resolver.Prune(now) {
		if group, ok := devicelimit.GroupOfKey(device); ok {
			h.log.Info("group quota override expired", "group", group)
			continue
		}
		h.log.Info("quota override expired", "device", device)
	}
	h.conns.closed(h.forget)
	h.devMu.Lock()
	for device, d := range h.devices {
		if len(d.live) == 0 && now.Sub(devicelimit.Tick(d.lastSeen.Load())) > lastSeenRetention {
			delete(h.devices, device)
		}
	}
	h.devMu.Unlock()
}
