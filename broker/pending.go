package broker

import (
	"sync"
)

// DefaultMaxPendingConnections is Limits.MaxPendingConnections when 0.
const DefaultMaxPendingConnections = 1000

// pendingGate bounds the connections that have been accepted but have not
// yet sent CONNECT (TLS handshakes and WebSocket upgrades included), on
// all listeners together. Each holds a goroutine and mochi's read and
// write buffers (about 50 KiB) until CONNECT or the connect timeout; a
// flood of idle sockets from many addresses, which the per-address
// connect rate does not stop, would otherwise hold memory without bound.
// A connection over the bound is closed as soon as it is accepted.
//
// Connections are keyed by their remote address (ip:port, unique among
// open TCP connections), which is what mochi's client knows them by when
// the auth hook sees CONNECT. Safe for concurrent use.
type pendingGate struct {
	max     int
	mu      sync.Mutex
	pending map[string]struct{}
}

func newPendingGate(max int) *pendingGate {
	if max <= 0 {
		max = DefaultMaxPendingConnections
	}
	return &pendingGate{max: max, pending: make(map[string]struct{})}
}

// acquire counts a new connection from remote as pending, or reports
// false when the bound is reached.
func (g *pendingGate) acquire(remote string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pending) >= g.max {
		return false
	}
	g.pending[remote] = struct{}{}
	return true
}

// release stops counting remote's connection: its CONNECT was read, or it
// ended. Releasing one not counted does nothing.
func (g *pendingGate) release(remote string) {
	g.mu.Lock()
	delete(g.pending, remote)
	g.mu.Unlock()
}

// len returns the number of pending connections.
func (g *pendingGate) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.pending)
}
