package broker

import (
	"container/list"
	"net"
	"sync"
)

// DefaultMaxPendingConnections is Limits.MaxPendingConnections when 0.
const DefaultMaxPendingConnections = 1000

// DefaultMaxPendingPerAddress is Limits.MaxPendingPerAddress when 0: a
// second of new connections at the default connect rate.
const DefaultMaxPendingPerAddress = 100

// Why a silent connection (one that has not sent CONNECT) was closed.
const (
	silentFull    = iota // the table was full: the oldest made room for a newcomer
	silentAddress        // its address held its bound: its oldest made room
	silentTimeout        // no CONNECT within the connect timeout
)

// pendingGate bounds the connections that have been accepted but have not
// yet sent CONNECT (TLS handshakes and WebSocket upgrades included), on
// all listeners together, and those of one source address. Each holds a
// goroutine and mochi's read and write buffers (about 50 KiB) until
// CONNECT or the connect timeout. A newcomer is never refused for them:
// when its address holds its bound, that address's oldest silent
// connection is closed; when the table is full, the oldest of all is.
// A flood of silent sockets therefore costs bounded memory and cannot
// keep a device that sends its CONNECT promptly out: it only shortens
// how long a silent socket is kept.
//
// Connections are keyed by their remote address (ip:port, unique among
// open TCP connections), which is what mochi's client knows them by when
// the auth hook sees CONNECT. Safe for concurrent use.
type pendingGate struct {
	mu              sync.Mutex
	max, perAddress int // g.mu
	pending         map[string]*pendingConn
	all             list.List             // *pendingConn, oldest first
	byHost          map[string]*list.List // per source address, oldest first
}

type pendingConn struct {
	conn      net.Conn
	remote    string
	host      string
	all, this *list.Element
}

func newPendingGate(max, perAddress int) *pendingGate {
	if max <= 0 {
		max = DefaultMaxPendingConnections
	}
	if perAddress <= 0 {
		perAddress = DefaultMaxPendingPerAddress
	}
	return &pendingGate{max: max, perAddress: perAddress, pending: make(map[string]*pendingConn), byHost: make(map[string]*list.List)}
}

// acquire counts c as pending. When that takes a place another silent
// connection held, it returns that connection, which the caller closes,
// and why (silentFull or silentAddress).
func (g *pendingGate) acquire(c net.Conn) (victim net.Conn, why int) {
	remote := c.RemoteAddr().String()
	host := remoteHost(remote)
	g.mu.Lock()
	defer g.mu.Unlock()
	own := g.byHost[host]
	switch {
	case own != nil && own.Len() >= g.perAddress:
		victim, why = g.drop(own.Front().Value.(*pendingConn)), silentAddress
		own = g.byHost[host] // drop may have deleted an emptied list
	case len(g.pending) >= g.max:
		victim, why = g.drop(g.all.Front().Value.(*pendingConn)), silentFull
		own = g.byHost[host]
	}
	if own == nil {
		own = list.New()
		g.byHost[host] = own
	}
	p := &pendingConn{conn: c, remote: remote, host: host}
	p.all = g.all.PushBack(p)
	p.this = own.PushBack(p)
	g.pending[remote] = p
	return victim, why
}

// drop forgets p and returns its connection. Called with g.mu held.
func (g *pendingGate) drop(p *pendingConn) net.Conn {
	delete(g.pending, p.remote)
	g.all.Remove(p.all)
	own := g.byHost[p.host]
	own.Remove(p.this)
	if own.Len() == 0 {
		delete(g.byHost, p.host)
	}
	return p.conn
}

// release stops counting remote's connection: its CONNECT was read, or it
// ended. It reports whether the connection was still counted (it ended
// silent, and was not closed to make room). Releasing one not counted
// does nothing.
func (g *pendingGate) release(remote string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.pending[remote]
	if ok {
		g.drop(p)
	}
	return ok
}

// setBounds puts new bounds in force (0: the default). Connections
// already pending beyond a lowered bound stay until they send CONNECT or
// time out; each newcomer then closes one of them to make room.
func (g *pendingGate) setBounds(max, perAddress int) {
	if max <= 0 {
		max = DefaultMaxPendingConnections
	}
	if perAddress <= 0 {
		perAddress = DefaultMaxPendingPerAddress
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.max, g.perAddress = max, perAddress
}

// bounds returns the bounds in force.
func (g *pendingGate) bounds() (max, perAddress int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.max, g.perAddress
}

// len returns the number of pending connections.
func (g *pendingGate) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.pending)
}
