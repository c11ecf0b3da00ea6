package broker

import (
	"sync"
	"time"
	"weak"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// takeoverWait bounds how long one connection of a client ID waits for
// another at a takeover (takeoverHook). It outlasts what the new
// connection may wait for in the hooks after this one (a first lease,
// leaseWait; a command in progress, cmdMu) before mochi takes the
// session over; past it, the connection goes on as mochi alone would.
const takeoverWait = 2 * leaseWait

// takeoverHook keeps mochi v2.7.9 from removing a client that has just
// taken a session over. A connection whose session ends with it (MQTT 5
// with session expiry 0, MQTT 3.1.1 clean session) ends, in mochi's
// attachClient, with "if expire && !cl.IsTakenOver(): unsubscribe cl,
// delete cl.ID from the client list", the delete by ID. The new
// connection of the same ID takes the session over in
// inheritClientSession (it stops the old connection, unsubscribes it,
// then marks it taken over) and then adds itself to the list. When the
// old connection's goroutine passes the check before the mark, or is
// past it when the new connection arrives, its delete may come after
// the new connection's add: the new connection stays up, acknowledged,
// but is in no list and no delivery reaches it (and the old one's
// unsubscribe may remove the new one's subscriptions, by ID).
// TestTakeoverKeepsNewConnection lost 1 to 3 rounds in 500 that way.
//
// mochi calls OnDisconnect on the old connection's goroutine right
// before that check, and OnSessionEstablish on the new one's right
// before inheritClientSession (nothing between fails), so the hook,
// first of the gateway's, orders the two per client ID:
//   - an old connection ending after a newer one of its ID passed
//     OnSessionEstablish waits, in OnDisconnect, until the newer one has
//     marked it taken over (mochi then deletes and unsubscribes
//     nothing of it), or is listed, or ended;
//   - a new connection arriving after an old one passed OnDisconnect
//     about to delete its ID waits, in OnSessionEstablish, until that
//     one is out of the list.
//
// Neither wait needs the goroutine of the connection waiting: the new
// connection writes its DISCONNECT to the old one itself (to a closed
// client or to the socket, not through the old one's reader) and
// unsubscribes it under mochi's topic locks; the old one's delete
// needs nothing of the new one.
//
// mochi tells of neither the mark nor the delete, so the waits poll
// them (pollTakeover); they happen only at a takeover, and the other
// hooks' OnDisconnect and OnSessionEstablish run after them, so they
// too see the takeover done. Publishes never pass here. Safe for
// concurrent use.
type takeoverHook struct {
	mqtt.HookBase
	srv *mqtt.Server

	mu  sync.Mutex
	ids map[string]*takeoverState
}

// takeoverState is what the hook knows of one client ID: the latest
// connection past OnSessionEstablish that has not disconnected, and the
// connection, if any, that mochi is about to delete from its list. Weak
// pointers: an entry never keeps a client's buffers alive after mochi
// let go of it (every connection of a session that ends with it leaves
// an entry until a sweep; TestHostileClients's heap grew by 41 MiB
// with strong ones), and a client collected is in no list.
type takeoverState struct {
	newest, leaving weak.Pointer[mqtt.Client]
}

func newTakeoverHook(srv *mqtt.Server) *takeoverHook {
	return &takeoverHook{srv: srv, ids: map[string]*takeoverState{}}
}

// ID returns the hook's ID.
func (h *takeoverHook) ID() string { return "devicegate-takeover" }

// Provides reports the hook methods takeoverHook implements.
func (h *takeoverHook) Provides(b byte) bool { return takeoverEvents[b] } // hookevents.go

// OnSessionEstablish records cl as its ID's newest connection and waits
// until a previous connection of the ID that mochi is about to delete
// is deleted.
func (h *takeoverHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if cl.Net.Inline {
		return
	}
	h.mu.Lock()
	st := h.ids[cl.ID]
	if st == nil {
		st = new(takeoverState)
		h.ids[cl.ID] = st
	}
	leaving := st.leaving
	st.newest = weak.Make(cl)
	h.mu.Unlock()
	if leaving.Value() == nil {
		return
	}
	pollTakeover(func() bool {
		listed, ok := h.srv.Clients.Get(cl.ID)
		return !ok || weak.Make(listed) != leaving
	})
	// Cleared only now: a connection of the ID arriving meanwhile
	// waits too.
	h.mu.Lock()
	if st.leaving == leaving {
		st.leaving = weak.Pointer[mqtt.Client]{}
	}
	h.mu.Unlock()
}

// OnDisconnect waits, when a newer connection of cl's ID is taking the
// session over, until it has; otherwise it records cl as leaving when
// mochi is about to delete it.
func (h *takeoverHook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if cl.Net.Inline {
		return
	}
	deletes := expire && !cl.IsTakenOver() // mochi's condition, after the hooks
	h.mu.Lock()
	st := h.ids[cl.ID]
	var newer *mqtt.Client
	switch {
	case st != nil && st.newest.Value() != nil && st.newest != weak.Make(cl):
		newer = st.newest.Value()
	case deletes:
		if st == nil {
			st = new(takeoverState)
			h.ids[cl.ID] = st
		}
		st.newest, st.leaving = weak.Pointer[mqtt.Client]{}, weak.Make(cl)
	case st != nil:
		st.newest = weak.Pointer[mqtt.Client]{}
		if st.leaving.Value() == nil {
			delete(h.ids, cl.ID)
		}
	}
	h.mu.Unlock()
	if newer != nil && deletes {
		pollTakeover(func() bool {
			listed, _ := h.srv.Clients.Get(cl.ID)
			return cl.IsTakenOver() || listed == newer || newer.Closed()
		})
	}
}

// sweepAtMost is how many IDs one sweep looks at: the map holds one per
// connected client ID, and the hook's lock is held throughout, so a
// sweep of a large fleet's every ID would hold up its connections and
// disconnections each tick. A map's range starts at a random place, so
// successive sweeps reach every entry.
const sweepAtMost = 4096

// sweep forgets the IDs whose connections are all gone: a leaving
// connection deleted with no newer one since, or a newest one mochi
// ended without OnDisconnect (a failed CONNACK write); at most
// sweepAtMost of them looked at.
func (h *takeoverHook) sweep() {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for id, st := range h.ids {
		if n++; n > sweepAtMost {
			return
		}
		listed, _ := h.srv.Clients.Get(id)
		newest, leaving := st.newest.Value(), st.leaving.Value()
		if (newest == nil || newest.Closed()) && (leaving == nil || listed != leaving) {
			delete(h.ids, id)
		}
	}
}

// pollTakeover returns once done reports true, or after takeoverWait.
// It checks at once, then at intervals growing from 20 µs to 2 ms: a
// takeover is over within microseconds unless the new connection waits
// for a lease or a command.
func pollTakeover(done func() bool) {
	deadline := time.Now().Add(takeoverWait)
	for d := 20 * time.Microsecond; !done() && time.Now().Before(deadline); d = min(2*d, 2*time.Millisecond) {
		time.Sleep(d)
	}
}
