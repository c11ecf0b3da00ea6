package broker

import (
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// registry is the broker's one table of live connections: for each mochi
// client, what the auth hook learned at CONNECT (its session: device and
// role, when authentication is on) and what the throttle keeps for its
// publishes (connInfo). The throttle removes an entry when the client
// disconnects, or at its sweep for a client mochi ended without
// OnDisconnect (a failed CONNACK write). Safe for concurrent use.
type registry struct{ m sync.Map } // *mqtt.Client -> *regEntry

// regEntry is one connection's entry. Its fields are set once each, by
// different hooks, and read from other goroutines (mochi checks the ACL
// of a delivery on the publisher's goroutine).
type regEntry struct {
	session atomic.Pointer[session]
	info    atomic.Pointer[connInfo]
}

func (r *registry) entry(cl *mqtt.Client) *regEntry {
	if v, ok := r.m.Load(cl); ok {
		return v.(*regEntry)
	}
	v, loaded := r.m.LoadOrStore(cl, new(regEntry))
	e := v.(*regEntry)
	if pc, ok := cl.Net.Conn.(*protoConn); ok && !loaded {
		// Held on the connection too, so that a publish finds it
		// without the map (lookup). Removed meanwhile, it goes again.
		pc.reg.Store(e)
		if v, ok := r.m.Load(cl); !ok || v != e {
			pc.reg.CompareAndSwap(e, nil)
		}
	}
	return e
}

// lookup returns cl's entry: the one its connection holds (a client of
// the gateway's listeners, from the first entry), else the map's (an
// inline client). On every publish and ack: the map's lookup hashes an
// interface, the connection's is a load.
func (r *registry) lookup(cl *mqtt.Client) (*regEntry, bool) {
	if pc, ok := cl.Net.Conn.(*protoConn); ok {
		if e := pc.reg.Load(); e != nil {
			return e, true
		}
	}
	if v, ok := r.m.Load(cl); ok {
		return v.(*regEntry), true
	}
	return nil, false
}

// setSession records an authenticated client's session.
func (r *registry) setSession(cl *mqtt.Client, s *session) { r.entry(cl).session.Store(s) }

// session returns cl's session, or nil (allow-all mode, or unknown).
func (r *registry) session(cl *mqtt.Client) *session {
	if e, ok := r.lookup(cl); ok {
		return e.session.Load()
	}
	return nil
}

// setInfo records the throttle's connection info for cl.
func (r *registry) setInfo(cl *mqtt.Client, c *connInfo) { r.entry(cl).info.Store(c) }

// info returns the throttle's connection info for cl, or nil.
func (r *registry) info(cl *mqtt.Client) *connInfo {
	if e, ok := r.lookup(cl); ok {
		return e.info.Load()
	}
	return nil
}

// remove forgets cl and returns its connection info (nil when the
// throttle never had one), and whether cl was there: once, whoever asks
// first.
func (r *registry) remove(cl *mqtt.Client) (*connInfo, bool) {
	v, ok := r.m.LoadAndDelete(cl)
	if !ok {
		return nil, false
	}
	e := v.(*regEntry)
	if pc, ok := cl.Net.Conn.(*protoConn); ok {
		pc.reg.CompareAndSwap(e, nil)
	}
	return e.info.Load(), true
}

// closed calls fn for every registered client that has ended.
func (r *registry) closed(fn func(*mqtt.Client)) {
	r.m.Range(func(k, _ any) bool {
		if cl := k.(*mqtt.Client); cl.Closed() {
			fn(cl)
		}
		return true
	})
}

// len returns the connections registered.
func (r *registry) len() int {
	n := 0
	r.m.Range(func(any, any) bool { n++; return true })
	return n
}
