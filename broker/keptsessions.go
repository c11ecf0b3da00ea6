package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/auth"
)

// SessionStore keeps, durably, the sessions of clients that keep one
// (MQTT 3.1.1 without clean session, MQTT 5 with a session expiry) and
// the commands from upstream (PublishCommand) queued in them and not
// yet acknowledged (persist.Store). Each write is durable when it
// returns nil.
type SessionStore interface {
	PutSession(clientID string, rec []byte) error
	DeleteSession(clientID string) error
	PutCommand(clientID string, packetID uint16, rec []byte) error
	DeleteCommand(clientID string, packetID uint16) error
	// LoadSessions calls session for every kept session, then command
	// for every queued command; rec is valid only during the call.
	LoadSessions(session func(clientID string, rec []byte) error, command func(clientID string, packetID uint16, rec []byte) error) error
}

// commandOrigin is the client ID of the inline client that publishes
// commands: a packet with this origin is a command. (A "/" is in no
// device's client ID: the topic templates refuse it.)
const commandOrigin = "devicegate/commands"

// commandListener is the commands' inline client's listener: the
// throttle passes its publishes uncounted.
const commandListener = "commands"

// keptRecord is a kept session as stored: what mochi needs to restore
// the client and its subscriptions, and what authentication made of it
// (Device, Role: the deliveries to the session while the client is
// away are authorized by them).
type keptRecord struct {
	Username       string                 `json:"username,omitempty"`
	Device         string                 `json:"device,omitempty"`
	Role           auth.Role              `json:"role,omitempty"`
	Authenticated  bool                   `json:"authenticated,omitempty"`
	Listener       string                 `json:"listener,omitempty"`
	Version        byte                   `json:"version"`
	Clean          bool                   `json:"clean,omitempty"`
	Expiry         uint32                 `json:"expiry,omitempty"`
	ExpiryFlag     bool                   `json:"expiry_flag,omitempty"`
	ReceiveMaximum uint16                 `json:"receive_maximum,omitempty"`
	Subscriptions  []storage.Subscription `json:"subscriptions,omitempty"`
}

type commandKey struct {
	client string
	id     uint16
}

// sessionHook keeps the sessions of clients that keep one, and the
// commands queued in them, in the SessionStore (when there is one), and
// restores them when the broker starts: a device away while the gateway
// restarts (or crashes) still gets the commands queued for it. It also
// remembers what authentication made of each kept session, so that a
// delivery to it while its client is away is authorized (authHook's
// OnACLCheck). Safe for concurrent use.
type sessionHook struct {
	mqtt.HookBase
	store SessionStore // nil: sessions kept in memory only
	conns *registry
	log   *slog.Logger

	srv *mqtt.Server
	// cmdMu serializes commands (Server.Publish) and the takeovers of
	// kept sessions: mochi moves a session to the client taking it over
	// (inheritClientSession) before it lists that client as the ID's,
	// and a message published in between lands in the old client's
	// list, lost. A takeover holds it from OnSessionEstablish to
	// OnSessionEstablished (or OnDisconnect, or takeoverLimit).
	cmdMu     sync.Mutex
	takeovers sync.Map // *mqtt.Client -> func() releasing cmdMu, once

	// mu guards the maps and failed, and is never held across a write
	// to the data file: a publish's QoS flow (OnQosComplete) and an ACL
	// check of an away session (authOf) never wait for the disk. A
	// command's writes are ordered per key (cmdEntry).
	mu     sync.RWMutex
	kept   map[string]*keptEntry    // client ID -> kept session
	cmds   map[commandKey]*cmdEntry // commands queued, and keys being written
	nq     atomic.Int64             // commands queued: OnQosComplete's fast path
	failed error                    // a command not stored; Publish reads it under cmdMu

	// restored at Start, for mochi's readStore
	clients  []storage.Client
	subs     []storage.Subscription
	inflight []storage.Message
}

type keptEntry struct {
	rec  []byte   // as stored
	auth *session // nil without authentication
}

// cmdEntry is what the hook knows of one command key (client ID and
// packet ID). queued, the check of it and its change are under the
// hook's mu, so "not yet queued, then queued" is atomic per key; the
// data file is written after, outside mu, under io, one write of the
// key at a time, and each write stores the key's latest state (settle):
// however a put and a delete of one key interleave, the file ends as
// the last change left the key.
type cmdEntry struct {
	queued bool
	rec    []byte // the command as stored, while queued
	ver    uint64 // counts the changes of queued
	users  int    // changes whose write is not done yet
	// io orders the key's writes; written is the ver the data file
	// holds (under io).
	io      sync.Mutex
	written uint64
}

func newSessionHook(srv *mqtt.Server, store SessionStore, conns *registry, log *slog.Logger) *sessionHook {
	return &sessionHook{srv: srv, store: store, conns: conns, log: log, kept: map[string]*keptEntry{}, cmds: map[commandKey]*cmdEntry{}}
}

// queue marks the command of key k queued (rec: as stored) or not (mu
// held) and returns its entry and the change's version, for settle.
func (h *sessionHook) queue(k commandKey, queued bool, rec []byte) (*cmdEntry, uint64) {
	e := h.cmds[k]
	if e == nil {
		e = new(cmdEntry)
		h.cmds[k] = e
	}
	h.mark(e, queued, rec)
	e.users++
	return e, e.ver
}

// mark changes e's queued (mu held).
func (h *sessionHook) mark(e *cmdEntry, queued bool, rec []byte) {
	if e.queued != queued {
		if queued {
			h.nq.Add(1)
		} else {
			h.nq.Add(-1)
		}
	}
	e.queued, e.rec = queued, rec
	e.ver++
}

// settle writes key k as its latest change left it, unless a write
// since change ver did (mu not held). It returns the error of a put
// that failed (the command is then no longer queued), and logs that of
// a delete.
func (h *sessionHook) settle(k commandKey, e *cmdEntry, ver uint64) error {
	var putErr error
	e.io.Lock()
	if e.written < ver && h.store != nil {
		h.mu.RLock()
		queued, rec, cur := e.queued, e.rec, e.ver
		h.mu.RUnlock()
		var err error
		if queued {
			err = h.store.PutCommand(k.client, k.id, rec)
		} else {
			err = h.store.DeleteCommand(k.client, k.id)
		}
		switch {
		case err == nil:
			e.written = cur
		case queued:
			putErr = err
			h.mu.Lock()
			if e.ver == cur {
				h.mark(e, false, nil)
			}
			h.mu.Unlock()
		default:
			h.log.Error("acknowledged command not removed from the data file: sent again after a restart", "client", k.client, "error", err)
		}
	}
	e.io.Unlock()
	h.mu.Lock()
	if e.users--; e.users == 0 && !e.queued && h.cmds[k] == e {
		delete(h.cmds, k)
	}
	h.mu.Unlock()
	return putErr
}

// takeoverLimit bounds how long a takeover holds back commands when
// mochi ends the connection between OnSessionEstablish and
// OnSessionEstablished without telling (a CONNACK that could not be
// written).
const takeoverLimit = 5 * time.Second

// ID returns the hook's ID.
func (h *sessionHook) ID() string { return "devicegate-sessions" }

// Provides reports the hook methods sessionHook implements.
func (h *sessionHook) Provides(b byte) bool {
	if h.store != nil {
		return sessionStoreEvents[b] // hookevents.go
	}
	return sessionEvents[b]
}

// keeps reports whether cl's session outlives its connection.
func keeps(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

// record encodes cl's session as it is now.
func (h *sessionHook) record(cl *mqtt.Client, s *session) []byte {
	r := keptRecord{Username: string(cl.Properties.Username), Listener: cl.Net.Listener, Version: cl.Properties.ProtocolVersion,
		Clean: cl.Properties.Clean, Expiry: cl.Properties.Props.SessionExpiryInterval, ExpiryFlag: cl.Properties.Props.SessionExpiryIntervalFlag,
		ReceiveMaximum: cl.Properties.Props.ReceiveMaximum}
	if s != nil {
		r.Device, r.Role, r.Authenticated = s.device, s.role, true
	}
	for filter, sub := range cl.State.Subscriptions.GetAll() {
		r.Subscriptions = append(r.Subscriptions, storage.Subscription{Filter: filter, Qos: sub.Qos, NoLocal: sub.NoLocal,
			RetainAsPublished: sub.RetainAsPublished, RetainHandling: sub.RetainHandling, Identifier: sub.Identifier})
	}
	// Map order is random: sorted, an unchanged session is not written again.
	slices.SortFunc(r.Subscriptions, func(a, b storage.Subscription) int { return strings.Compare(a.Filter, b.Filter) })
	b, _ := json.Marshal(r) // plain fields: cannot fail
	return b
}

// save stores cl's session when it changed (a new kept session, a
// subscription made or removed).
func (h *sessionHook) save(cl *mqtt.Client) {
	s := h.conns.session(cl)
	rec := h.record(cl, s)
	h.mu.RLock()
	e := h.kept[cl.ID]
	h.mu.RUnlock()
	if e != nil && bytes.Equal(e.rec, rec) {
		return
	}
	// Written unlocked: devices connecting together share a transaction
	// (a client's own calls come one at a time, from its goroutine).
	if h.store != nil {
		if err := h.store.PutSession(cl.ID, rec); err != nil {
			h.log.Error("kept session not stored: lost if the gateway stops", "client", cl.ID, "error", err)
			return
		}
	}
	h.mu.Lock()
	h.kept[cl.ID] = &keptEntry{rec: rec, auth: s}
	h.mu.Unlock()
}

// forget removes the kept session of id and its queued commands: from
// the maps under mu, then from the data file (DeleteSession removes the
// session's commands too). A put of one of its commands under way can
// land after it: a command without a session, which load skips.
func (h *sessionHook) forget(id string) {
	h.mu.Lock()
	if _, ok := h.kept[id]; !ok {
		h.mu.Unlock()
		return
	}
	delete(h.kept, id)
	for k, e := range h.cmds {
		if k.client == id {
			if e.queued {
				h.mark(e, false, nil)
			}
			if e.users == 0 {
				delete(h.cmds, k)
			}
		}
	}
	h.mu.Unlock()
	if h.store != nil {
		if err := h.store.DeleteSession(id); err != nil {
			h.log.Error("ended session not removed from the data file: restored at the next start", "client", id, "error", err)
		}
	}
}

// OnSessionEstablish holds commands back while cl takes over a kept
// session (see cmdMu).
func (h *sessionHook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	if cl.Net.Inline || pk.Connect.Clean {
		return
	}
	if _, ok := h.srv.Clients.Get(cl.ID); !ok {
		return
	}
	h.cmdMu.Lock()
	var once sync.Once
	release := func() {
		once.Do(func() {
			h.takeovers.Delete(cl)
			h.cmdMu.Unlock()
		})
	}
	h.takeovers.Store(cl, release)
	time.AfterFunc(takeoverLimit, release)
}

// endTakeover lets commands go on once cl's takeover is over.
func (h *sessionHook) endTakeover(cl *mqtt.Client) {
	if f, ok := h.takeovers.Load(cl); ok {
		f.(func())()
	}
}

// OnSessionEstablished stores a kept session, or forgets the one a
// client starting clean had.
func (h *sessionHook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if cl.Net.Inline {
		return
	}
	h.endTakeover(cl)
	if keeps(cl) {
		h.save(cl)
	} else {
		h.forget(cl.ID)
	}
}

// OnSubscribed stores a kept session's new subscriptions.
func (h *sessionHook) OnSubscribed(cl *mqtt.Client, _ packets.Packet, _ []byte) {
	if !cl.Net.Inline && keeps(cl) {
		h.save(cl)
	}
}

// OnUnsubscribed stores a kept session's remaining subscriptions. A
// client whose session was taken over loses its subscriptions to the
// new one: nothing changed.
func (h *sessionHook) OnUnsubscribed(cl *mqtt.Client, _ packets.Packet) {
	if !cl.Net.Inline && keeps(cl) && !cl.IsTakenOver() {
		h.save(cl)
	}
}

// OnDisconnect forgets a session that ends with its connection (an MQTT
// 5 client that set its session expiry to 0 when it left). A session
// taken over by a new connection of the same client is the new one's.
func (h *sessionHook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	h.endTakeover(cl)
	if expire && !cl.Net.Inline && !cl.IsTakenOver() {
		h.forget(cl.ID)
	}
}

// OnClientExpired forgets a session whose expiry passed.
func (h *sessionHook) OnClientExpired(cl *mqtt.Client) { h.forget(cl.ID) }

// OnQosPublish stores a command queued in a kept session before it is
// sent (mochi calls it before the write): PublishCommand returns only
// once every kept session it reached holds it durably.
func (h *sessionHook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	if pk.Origin != commandOrigin || pk.FixedHeader.Type != packets.Publish {
		return
	}
	k := commandKey{cl.ID, pk.PacketID}
	var rec []byte
	if h.store != nil {
		m := storage.Message{Client: cl.ID, Origin: pk.Origin, TopicName: pk.TopicName, Payload: pk.Payload,
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: pk.FixedHeader.Qos, Retain: pk.FixedHeader.Retain},
			Created:     pk.Created, PacketID: pk.PacketID, Properties: storage.MessageProperties{MessageExpiryInterval: pk.Properties.MessageExpiryInterval}}
		rec, _ = json.Marshal(m)
	}
	h.mu.Lock()
	if e := h.cmds[k]; e != nil && e.queued {
		h.mu.Unlock()
		return // sent again on a reconnect: stored already (or being stored)
	}
	if _, ok := h.kept[cl.ID]; !ok {
		h.mu.Unlock()
		return // a clean session: it ends with its connection
	}
	e, ver := h.queue(k, true, rec)
	h.mu.Unlock()
	if err := h.settle(k, e, ver); err != nil {
		h.mu.Lock()
		h.failed = errors.Join(h.failed, fmt.Errorf("queue for %q: %w", cl.ID, err))
		h.mu.Unlock()
	}
}

// OnQosComplete removes an acknowledged command. It is called for every
// QoS 1 and 2 flow, both ways: the fast path reads one atomic, and a
// flow the client started is never a command's (serverFlow).
func (h *sessionHook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	if h.nq.Load() > 0 && serverFlow(pk) {
		h.done(cl, pk.PacketID)
	}
}

// OnQosDropped removes a command mochi dropped (expired in flight). A
// client whose session was taken over drops its list, which the new
// client holds: nothing is dropped.
func (h *sessionHook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if h.nq.Load() > 0 && !cl.IsTakenOver() && serverFlow(pk) {
		h.done(cl, pk.PacketID)
	}
}

// done removes the command queued for cl under id, if one is. (mochi
// keeps one packet ID list per client for both directions; a publish of
// cl's under a queued command's ID is moved to another, packetids.go.)
func (h *sessionHook) done(cl *mqtt.Client, id uint16) {
	k := commandKey{cl.ID, id}
	h.mu.RLock() // most flows are not commands: read-locked, they wait on nothing
	e := h.cmds[k]
	queued := e != nil && e.queued
	h.mu.RUnlock()
	if !queued {
		return
	}
	h.mu.Lock()
	if e = h.cmds[k]; e == nil || !e.queued {
		h.mu.Unlock()
		return
	}
	e, ver := h.queue(k, false, nil)
	h.mu.Unlock()
	_ = h.settle(k, e, ver) // a delete's error is logged
}

// takeFailed returns and clears the commands not stored since the last
// call.
func (h *sessionHook) takeFailed() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.failed
	h.failed = nil
	return err
}

// authOf returns what authentication made of the kept session of id,
// or nil.
func (h *sessionHook) authOf(id string) *session {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if e := h.kept[id]; e != nil {
		return e.auth
	}
	return nil
}

// load reads the stored sessions and commands, for mochi's readStore
// (StoredClients and the rest) at Start.
func (h *sessionHook) load() error {
	if h.store == nil {
		return nil
	}
	err := h.store.LoadSessions(func(id string, rec []byte) error {
		var r keptRecord
		if err := json.Unmarshal(rec, &r); err != nil {
			return fmt.Errorf("kept session of %q: %w", id, err)
		}
		h.clients = append(h.clients, storage.Client{ID: id, Username: []byte(r.Username), Listener: r.Listener, ProtocolVersion: r.Version, Clean: r.Clean,
			Properties: storage.ClientProperties{SessionExpiryInterval: r.Expiry, SessionExpiryIntervalFlag: r.ExpiryFlag, ReceiveMaximum: r.ReceiveMaximum}})
		for _, s := range r.Subscriptions {
			s.Client = id
			h.subs = append(h.subs, s)
		}
		e := &keptEntry{rec: bytes.Clone(rec)}
		if r.Authenticated {
			e.auth = &session{device: r.Device, role: r.Role}
		}
		h.kept[id] = e
		return nil
	}, func(id string, packetID uint16, rec []byte) error {
		var m storage.Message
		if err := json.Unmarshal(rec, &m); err != nil || m.Client != id || m.PacketID != packetID {
			return fmt.Errorf("command queued for %q under packet ID %d: does not decode (%v)", id, packetID, err)
		}
		if _, ok := h.kept[id]; !ok {
			return nil // its session is gone: the command with it
		}
		h.inflight = append(h.inflight, m)
		e := &cmdEntry{queued: true, rec: bytes.Clone(rec), ver: 1, written: 1}
		h.cmds[commandKey{id, packetID}] = e
		h.nq.Add(1)
		return nil
	})
	if err != nil {
		return fmt.Errorf("restore kept sessions: %w", err)
	}
	return nil
}

// StoredClients returns the kept sessions' clients, restored by mochi
// as away.
func (h *sessionHook) StoredClients() ([]storage.Client, error) { return h.clients, nil }

// StoredSubscriptions returns the kept sessions' subscriptions.
func (h *sessionHook) StoredSubscriptions() ([]storage.Subscription, error) { return h.subs, nil }

// StoredInflightMessages returns the commands queued in kept sessions,
// sent when their clients come back.
func (h *sessionHook) StoredInflightMessages() ([]storage.Message, error) {
	m := h.inflight
	h.clients, h.subs, h.inflight = nil, nil, nil
	return m, nil
}

// restored returns the kept sessions and queued commands held.
func (h *sessionHook) restored() (sessions, commands int) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.kept), int(h.nq.Load())
}
