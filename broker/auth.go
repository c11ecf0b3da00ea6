package broker

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/devicelimit"
)

// Auth configures client authentication and the topic ACL. The zero
// value allows every client and every topic (allow-all).
type Auth struct {
	// Credentials, when not nil, authenticate clients by username and
	// password, and say which client IDs each username may use.
	Credentials *auth.Credentials
	// Certificates, when set, authenticates a client that presents a
	// verified certificate on the TLS listener (see Options.TLS): its
	// identity is taken from the certificate's CertField, the client ID
	// must equal it, and the connection's username is set to it.
	Certificates bool
	CertField    auth.CertField
	// ACL holds the devices' topic templates; required (auth.NewACL)
	// when Credentials or Certificates is set.
	ACL auth.ACL
}

// AllowAll reports whether a is the allow-all mode.
func (a Auth) AllowAll() bool { return a.Credentials == nil && !a.Certificates }

// Limits bound what clients can take of the broker. Zero fields leave
// that bound off.
type Limits struct {
	// MaxPacketSize is the largest MQTT packet accepted, in bytes
	// (fixed header included); a larger one ends the connection before
	// its body is read. Without it a client can make the broker
	// allocate 256 MiB by announcing that length.
	MaxPacketSize uint32
	// MaxClientIDLength is the longest client ID accepted at CONNECT.
	MaxClientIDLength int
	// MaxConnections bounds the clients connected at once, and the
	// sessions the broker holds, connected or kept for a client that
	// asked for a persistent session (MQTT 3.1.1 without clean session,
	// MQTT 5 with a session expiry): a new client ID beyond it is refused
	// (MQTT 5: 0x89 server busy; 3.1.1: 0x03), one with a held session
	// still gets back in.
	MaxConnections int
	// MaxPendingWrites bounds the messages queued for one client that
	// does not read fast enough; beyond it, messages to that client are
	// dropped and counted in Stats.SlowSubscriberDrops. Each connection
	// reserves 8 bytes per slot whether it ever subscribes or not.
	// DefaultMaxPendingWrites when 0.
	MaxPendingWrites int
	// Consumers are globs of the client IDs of backend consumers. Each
	// gets a write spool of ConsumerWriteBuffer bytes, and admitted
	// publishes wait before delivery while its queue has no room for
	// them (consumers.go): a burst waits in the spool, or at the
	// publishers, rather than being dropped at MaxPendingWrites.
	Consumers []string
	// ConsumerWriteBuffer is the most bytes a consumer's spool holds;
	// DefaultConsumerWriteBuffer when 0.
	ConsumerWriteBuffer int
	// MaxInflight bounds the QoS 1 and 2 messages sent to one client
	// and not yet acknowledged; a message beyond is dropped for that
	// client and counted in Stats.SlowSubscriberDrops. 0 means mochi's
	// default, 8192.
	MaxInflight int
	// MaxDevices bounds the devices with a window: a device without one
	// is refused at CONNECT (MQTT 5: 0x97 quota exceeded; 3.1.1: 0x03
	// server unavailable) while the table holds that many.
	MaxDevices int
	// ConnectRate bounds the new connections per source IP address;
	// a connection over it is closed before it is read. Zero Limit: no
	// bound.
	ConnectRate devicelimit.Quota
	// ConnectRateExempt lists the source addresses ConnectRate does not
	// apply to: a load balancer, a NAT gateway, a local simulator.
	ConnectRateExempt []netip.Prefix
	// KeepaliveMin and KeepaliveMax bound the keepalive a client may
	// ask for; one outside (or 0, none) is set to the bound, and an
	// MQTT 5 client is told so in its CONNACK (server keep alive).
	KeepaliveMin, KeepaliveMax time.Duration
	// MaxPendingConnections bounds the connections accepted on all
	// listeners that have not yet sent CONNECT (TLS handshakes and
	// WebSocket upgrades included); one more is closed as it is
	// accepted. DefaultMaxPendingConnections when 0.
	MaxPendingConnections int
	// MaxPendingPerAddress bounds those of one source IP address.
	// DefaultMaxPendingPerAddress when 0. Over either bound, the oldest
	// silent connection (of the address, or of all) is closed to make
	// room: a newcomer is never refused for them (pending.go).
	MaxPendingPerAddress int
	// TopicAliasMaximum is the highest topic alias an MQTT 5 client may
	// use: announced in its CONNACK, and a PUBLISH with a higher one
	// ends the connection with DISCONNECT 0x94 (MQTT 5, 3.3.2.3.4).
	// DefaultTopicAliasMaximum when 0; a negative value allows none
	// (the CONNACK announces none, and every alias is refused).
	TopicAliasMaximum int
}

func (l Limits) validate() error {
	switch {
	case l.MaxClientIDLength < 0 || l.MaxConnections < 0 || l.MaxPendingConnections < 0 || l.MaxPendingPerAddress < 0 || l.MaxDevices < 0 || l.MaxPendingWrites < 0 || l.MaxPendingWrites > 1<<20 || l.MaxInflight < 0 || l.MaxInflight > 65535:
		return fmt.Errorf("%w: Limits: negative bound, MaxPendingWrites over 1Mi or MaxInflight over 65535", ErrInvalidOptions)
	case l.KeepaliveMin < 0 || l.KeepaliveMax < 0 || l.KeepaliveMax > 0 && l.KeepaliveMin > l.KeepaliveMax:
		return fmt.Errorf("%w: Limits: keepalive bounds must be >= 0 and min <= max", ErrInvalidOptions)
	case l.KeepaliveMax > 65535*time.Second:
		return fmt.Errorf("%w: Limits: KeepaliveMax must be at most 65535s", ErrInvalidOptions)
	case l.TopicAliasMaximum > 65535:
		return fmt.Errorf("%w: Limits: TopicAliasMaximum must be at most 65535", ErrInvalidOptions)
	case l.MaxPacketSize != 0 && l.MaxPacketSize < 64:
		return fmt.Errorf("%w: Limits: MaxPacketSize must be 0 or at least 64 bytes", ErrInvalidOptions)
	}
	if l.ConnectRate.Limit != 0 {
		if err := l.ConnectRate.Validate(auth.ConnectRateBuckets); err != nil {
			return fmt.Errorf("%w: Limits.ConnectRate: %v", ErrInvalidOptions, err)
		}
	}
	if l.ConsumerWriteBuffer < 0 {
		return fmt.Errorf("%w: Limits.ConsumerWriteBuffer must be >= 0", ErrInvalidOptions)
	}
	for _, p := range l.Consumers {
		if _, err := devicelimit.CompileGlob(p); err != nil {
			return fmt.Errorf("%w: Limits.Consumers: %v", ErrInvalidOptions, err)
		}
	}
	if len(l.Consumers) > 0 && outboundField == nil {
		return fmt.Errorf("%w: Limits.Consumers: this mochi version keeps no outbound queue the consumers can watch (consumers.go)", ErrInvalidOptions)
	}
	return nil
}

// Defaults of Limits' zero fields. MaxPendingWrites suits a fleet of
// mostly idle devices (mochi's own default, 8192, reserves 64 KiB per
// connection); backend consumers get a spool. MaxInflight is mochi's.
const (
	DefaultMaxPendingWrites    = 64
	DefaultConsumerWriteBuffer = 64 << 20
	DefaultMaxInflight         = 8192
	// DefaultTopicAliasMaximum is Mosquitto's default (max_topic_alias):
	// a device publishes to a few topics, and every alias a connection
	// sets keeps its topic (up to 64 KiB) for as long as it lasts.
	DefaultTopicAliasMaximum = 10
)

// topicAliasMaximum returns the alias maximum the limits ask for.
func (l Limits) topicAliasMaximum() uint16 {
	switch {
	case l.TopicAliasMaximum < 0:
		return 0
	case l.TopicAliasMaximum == 0:
		return DefaultTopicAliasMaximum
	}
	return uint16(l.TopicAliasMaximum)
}

// capabilities returns mochi's capabilities with the limits applied.
func (l Limits) capabilities() *mqtt.Capabilities {
	c := mqtt.NewDefaultServerCapabilities()
	c.MaximumPacketSize = l.MaxPacketSize
	// mochi copies a publish's properties into its PUBACK or PUBREC, and
	// an ack with user properties then goes out with reason code 0x01,
	// which is no PUBACK code (MQTT 5, 3.4.2.1): clients fail the publish.
	c.Compatibilities.NoInheritedPropertiesOnAck = true
	// mochi gives every message without a Message Expiry Interval one of
	// this maximum (a day), and forwards it to MQTT 5 subscribers as if
	// the publisher had sent it; 0 forwards what the publisher sent.
	// Messages held for a subscriber are bounded by MaximumInflight per
	// client and by MaxConnections for the sessions, not by age.
	c.MaximumMessageExpiryInterval = 0
	if l.MaxConnections > 0 {
		c.MaximumClients = int64(l.MaxConnections)
	}
	if l.MaxInflight > 0 {
		c.MaximumInflight = uint16(l.MaxInflight)
	}
	c.TopicAliasMaximum = l.topicAliasMaximum() // enforced by mochi: 0x94 beyond; announced by alias.go
	c.MaximumClientWritesPending = DefaultMaxPendingWrites
	if l.MaxPendingWrites > 0 {
		c.MaximumClientWritesPending = int32(l.MaxPendingWrites)
	}
	return c
}

// AuthStats counts refusals by the auth hook and the listeners since New.
type AuthStats struct {
	// PublishDenied counts publishes refused by the topic ACL (MQTT 5
	// QoS>0 gets 0x87; 3.1.1 QoS>0 is disconnected; QoS 0 is dropped).
	PublishDenied uint64
	// SubscribeDenied counts subscriptions refused by the topic ACL.
	SubscribeDenied uint64
	// ConnectsRefused counts refused CONNECTs by reason: "credentials"
	// (unknown user or wrong password), "client_id" (not allowed or not
	// valid), "certificate", "devices" (MaxDevices reached), "rate"
	// (connections closed by the per-address rate limit), "will" (a
	// will on a topic the client may not publish to), "sessions"
	// (MaxConnections sessions held, connected or not) and "busy" (too
	// many password checks running or waiting), "protocol" (a CONNECT
	// the MQTT specification forbids: protocheck.go, connectcheck.go),
	// and the connections that never sent CONNECT (pending.go):
	// "pending_full" (the oldest, closed to make room when
	// Limits.MaxPendingConnections had not sent it), "pending_address"
	// (an address's oldest, closed when it held MaxPendingPerAddress)
	// and "connect_timeout" (none within the connect timeout).
	ConnectsRefused map[string]uint64
	// ProtocolErrors counts connections ended after CONNECT for a packet
	// the specification forbids (MQTT 5 DISCONNECT 0x82: protocheck.go,
	// alias.go).
	ProtocolErrors uint64
	// ConsumersSpooled counts the connections of backend consumers
	// (Limits.Consumers) given a write spool; ConsumerWaits the
	// publishes that waited for a consumer's writer (consumers.go);
	// ConsumerWaitsExpired those of them that went on after
	// consumerWait without room (on a machine so loaded that the writer
	// got no processor for that long): only they can cost a consumer a
	// message.
	ConsumersSpooled, ConsumerWaits, ConsumerWaitsExpired uint64
	// ConsumerSpoolBytes is what the connected consumers' spools hold.
	ConsumerSpoolBytes int64
}

// Refusal reasons, the keys of AuthStats.ConnectsRefused.
const (
	refusedCredentials = iota
	refusedClientID
	refusedCertificate
	refusedDevices
	refusedRate
	refusedWill
	refusedSessions
	refusedBusy
	refusedPendingFull
	refusedPendingAddress
	refusedConnectTimeout
	refusedProtocol
	refusedBlocked
	refusedReasons
)

var refusedNames = [refusedReasons]string{"credentials", "client_id", "certificate", "devices", "rate", "will", "sessions", "busy", "pending_full", "pending_address", "connect_timeout", "protocol", "blocked"}

// authHook is the mochi hook that authenticates clients at CONNECT,
// applies the connection limits and enforces the topic ACL. It is added
// before the throttle, so a refused client never reaches it, and a
// publish the ACL refuses is never counted against a quota.
type authHook struct {
	mqtt.HookBase

	srv      *mqtt.Server
	opts     Auth
	limits   Limits
	table    *devicelimit.Table
	identity devicelimit.Identity
	clock    devicelimit.Clock
	log      *slog.Logger
	logs     *logLimiter  // one log line per key per refusalLogWindow
	blocks   *blocks      // devices blocked (automatic blocking)
	kept     *sessionHook // what authentication made of kept sessions whose clients are away

	// conns is the broker's registry of connections: OnConnect records
	// an authenticated client's session there, the ACL reads it; the
	// throttle removes entries.
	conns *registry

	// rate counts new connections per source address, under the rate
	// and exemptions of connect (Limits.ConnectRate, or the latest
	// SetLimits'; a zero limit: no bound).
	rate    *devicelimit.Table
	connect atomic.Pointer[connectRate]

	// acl is the topic ACL in force: Auth.ACL, or the latest SetACL's.
	acl atomic.Pointer[auth.ACL]

	// consumers are the backend consumers (consumers.go).
	consumers *consumerSet

	// remaps are the client publishes moved off a delivery's packet ID
	// (packetids.go).
	remaps idRemaps

	// ownClients counts mochi's own clients in its client list (the
	// inline client), which are no sessions of anyone.
	ownClients int

	// creds are the accounts in force: Auth.Credentials, or those of
	// the latest SetCredentials.
	creds atomic.Pointer[auth.Credentials]

	pubDenied, subDenied atomic.Uint64
	protocolErrors       atomic.Uint64
	refused              [refusedReasons]atomic.Uint64
	pending              *pendingGate // connections not yet past CONNECT
}

// connectRate is the per-address connection rate in force.
type connectRate struct {
	quota  devicelimit.Quota
	exempt []netip.Prefix
}

// session is an authenticated connection's device and role.
type session struct {
	device string
	role   auth.Role
}

// ID returns the hook's ID.
func (h *authHook) ID() string { return "devicegate-auth" }

// Provides reports the hook methods authHook implements.
func (h *authHook) Provides(b byte) bool { return authEvents[b] } // hookevents.go

// OnConnectAuthenticate lets in every client OnConnect has not refused.
func (h *authHook) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }

// refusal is why a CONNECT is refused: the MQTT 5 reason code with its
// reason string, and the MQTT 3.1.1 return code.
type refusal struct {
	reason int
	v5, v3 packets.Code
}

func refuse(reason int, v5 packets.Code, msg string, v3 packets.Code) *refusal {
	v5.Reason = msg
	return &refusal{reason: reason, v5: v5, v3: v3}
}

// OnConnect applies the client-ID and keepalive limits, authenticates
// the client and applies MaxDevices. It sends the refusal's CONNACK
// itself: mochi closes the connection without one when OnConnect fails.
func (h *authHook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	if h.pending != nil {
		h.pending.release(cl.Net.Remote) // CONNECT is read: MaxConnections takes over
	}
	h.boundKeepalive(cl)
	s, r := h.admit(cl, pk)
	if r == nil {
		if s != nil {
			h.conns.setSession(cl, s)
		}
		h.consumers.attach(cl)
		return nil
	}
	h.refused[r.reason].Add(1)
	if h.logs.allow(logRefused, refusedNames[r.reason]+" "+remoteHost(cl.Net.Remote), refusalLogWindow) {
		h.log.Warn("connection refused", "client", clip(cl.ID), "username", clip(string(cl.Properties.Username)),
			"remote", cl.Net.Remote, "listener", cl.Net.Listener, "reason", r.v5.Reason)
	}
	code := r.v5
	if cl.Properties.ProtocolVersion < 5 {
		code = r.v3
	}
	if err := h.srv.SendConnack(cl, code, false, nil); err != nil {
		return fmt.Errorf("refuse connection: %w", err)
	}
	return code
}

// clip shortens what a client sent for a log line: a client ID may be
// 64 KiB.
func clip(s string) string {
	const n = 128
	if len(s) <= n {
		return s
	}
	return strconv.Quote(s[:n]) + "..."
}

// boundKeepalive clamps the client's keepalive into the limits.
func (h *authHook) boundKeepalive(cl *mqtt.Client) {
	ka := time.Duration(cl.State.Keepalive) * time.Second
	switch {
	case h.limits.KeepaliveMax > 0 && (ka == 0 || ka > h.limits.KeepaliveMax):
		ka = h.limits.KeepaliveMax
	case h.limits.KeepaliveMin > 0 && ka < h.limits.KeepaliveMin:
		ka = h.limits.KeepaliveMin
	default:
		return
	}
	cl.State.Keepalive = uint16(ka / time.Second)
	cl.State.ServerKeepalive = true
}

// admit decides a CONNECT: the session of an authenticated client (nil
// in allow-all mode), or why it is refused.
func (h *authHook) admit(cl *mqtt.Client, pk packets.Packet) (*session, *refusal) {
	clientID := pk.Connect.ClientIdentifier
	if n := h.limits.MaxClientIDLength; n > 0 && len(clientID) > n {
		return nil, refuse(refusedClientID, packets.ErrClientIdentifierNotValid,
			"client identifier longer than "+strconv.Itoa(n)+" bytes", packets.Err3ClientIdentifierNotValid)
	}
	// mochi bounds only the connected clients; a session kept after its
	// client left costs its outbound queue until it expires (by default
	// in 136 years), so new client IDs could grow the heap without end.
	if n := h.limits.MaxConnections; n > 0 {
		if _, held := h.srv.Clients.Get(cl.ID); !held && h.srv.Clients.Len()-h.ownClients >= n {
			return nil, refuse(refusedSessions, packets.ErrServerBusy,
				"broker holds its maximum of "+strconv.Itoa(n)+" sessions; retry later", packets.ErrServerUnavailable)
		}
	}
	var s *session
	if !h.opts.AllowAll() {
		var r *refusal
		if s, r = h.authenticate(cl, pk); r != nil {
			return nil, r
		}
	}
	device := h.identity.Of(cl.ID, string(cl.Properties.Username))
	if h.blocks != nil {
		now := h.clock.Now()
		if until, blocked := h.blocks.until(device, now); blocked {
			return nil, refuse(refusedBlocked, packets.ErrBanned,
				fmt.Sprintf("blocked for refusals over quota until %s; retry after %s", until.Time().UTC().Format(time.RFC3339), ceilMillisecond(until.Sub(now))),
				packets.Err3NotAuthorized)
		}
	}
	if s != nil {
		s.device = device
		if s.role == auth.RoleDevice && !auth.ValidDevice(device) {
			return nil, refuse(refusedClientID, packets.ErrClientIdentifierNotValid,
				"device identity must not be empty or contain '/', '+' or '#' (topic ACL)", packets.Err3ClientIdentifierNotValid)
		}
		// mochi publishes a will without asking the ACL: check it now.
		if atomic.LoadUint32(&cl.Properties.Will.Flag) == 1 {
			topic := cl.Properties.Will.TopicName
			if s.role == auth.RoleConsumer || !h.acl.Load().CanPublish(device, topic) {
				h.pubDenied.Add(1)
				return nil, refuse(refusedWill, packets.ErrNotAuthorized,
					"will topic "+strconv.Quote(topic)+" is outside the topics this client may publish to", packets.Err3NotAuthorized)
			}
		}
	}
	if h.limits.MaxDevices > 0 && device != "" && (s == nil || s.role == auth.RoleDevice) {
		if _, known := h.table.Snapshot(device); !known && h.table.Len() >= h.limits.MaxDevices {
			return nil, refuse(refusedDevices, packets.ErrQuotaExceeded,
				"gateway tracks its maximum of "+strconv.Itoa(h.limits.MaxDevices)+" devices; retry later", packets.Err3ServerUnavailable)
		}
	}
	// A CONNECT that names no device: without a client ID mochi would
	// give each attempt a fresh random one, and a fresh window. MQTT
	// 3.1.1 gets return code 0x02 (identifier rejected), or 0x05 for a
	// missing username (mochi's mapping of 0x86).
	switch {
	case h.identity == devicelimit.IdentityUsername && len(cl.Properties.Username) == 0:
		return nil, refuse(refusedCredentials, packets.ErrBadUsernameOrPassword,
			"username required: devices are identified by username", packets.ErrBadUsernameOrPassword)
	case h.identity == devicelimit.IdentityClientID && clientID == "":
		return nil, refuse(refusedClientID, packets.ErrClientIdentifierNotValid,
			"client identifier required: devices are identified by client ID", packets.ErrClientIdentifierNotValid)
	}
	return s, nil
}

// authenticate checks a client's certificate or password.
func (h *authHook) authenticate(cl *mqtt.Client, pk packets.Packet) (*session, *refusal) {
	if h.opts.Certificates {
		if tc := tlsConn(cl.Net.Conn); tc != nil {
			if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
				// The listener verified the chain (tls.Config.ClientCAs).
				id, err := h.opts.CertField.Identity(certs[0])
				if err != nil {
					return nil, refuse(refusedCertificate, packets.ErrNotAuthorized, err.Error(), packets.Err3NotAuthorized)
				}
				if pk.Connect.ClientIdentifier != id {
					return nil, refuse(refusedClientID, packets.ErrClientIdentifierNotValid,
						"client identifier must be the certificate's "+h.opts.CertField.String()+" "+strconv.Quote(id), packets.Err3ClientIdentifierNotValid)
				}
				cl.Properties.Username = []byte(id)
				return &session{role: auth.RoleDevice}, nil
			}
		}
	}
	creds := h.creds.Load()
	if creds == nil {
		return nil, refuse(refusedCertificate, packets.ErrNotAuthorized,
			"a client certificate is required (TLS listener)", packets.Err3NotAuthorized)
	}
	role, login := creds.Check(string(cl.Properties.Username), pk.Connect.Password, pk.Connect.ClientIdentifier)
	switch login {
	case auth.LoginOK:
		return &session{role: role}, nil
	case auth.LoginClientIDNotAllowed:
		return nil, refuse(refusedClientID, packets.ErrClientIdentifierNotValid,
			"client identifier not allowed for this username", packets.Err3ClientIdentifierNotValid)
	case auth.LoginBusy:
		return nil, refuse(refusedBusy, packets.ErrServerBusy,
			"too many password checks in progress; retry later", packets.ErrServerUnavailable)
	}
	return nil, refuse(refusedCredentials, packets.ErrBadUsernameOrPassword, "bad username or password", packets.ErrMalformedUsernameOrPassword) // 3.1.1: 0x04 bad user name or password
}

// tlsConn returns the TLS connection under a client's connection (TLS
// listener, or WebSocket over TLS), or nil.
func tlsConn(c net.Conn) *tls.Conn {
	if pc, ok := c.(*protoConn); ok {
		c = pc.Conn
	}
	if ws, ok := c.(*wsConn); ok {
		c = ws.Conn
	}
	tc, _ := c.(*tls.Conn)
	return tc
}

// OnACLCheck enforces the topic ACL: a device publishes within its
// publish template and subscribes (and receives) within its subscribe
// template; a consumer subscribes to anything and publishes nothing.
// Under $devicegate/ statusACL decides, whatever the mode: a client
// reads its own status topic only, and nobody publishes.
// mochi calls it for every publish received (write), every subscription
// filter and every delivery (read). It does not allocate.
func (h *authHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if ok, decided := statusACL(cl, topic, write); decided { // status.go, in every mode
		if !ok {
			h.denied(write)
		}
		return ok
	}
	if h.opts.AllowAll() {
		return true
	}
	var ok bool
	s := h.conns.session(cl)
	if s == nil && !write && cl.Closed() && h.kept != nil {
		// A delivery to a kept session whose client is away (or was
		// restored at start): authorized as its client was when it
		// connected.
		s = h.kept.authOf(cl.ID)
	}
	if s != nil {
		switch acl := h.acl.Load(); {
		case s.role == auth.RoleConsumer:
			ok = !write
		case write:
			ok = acl.CanPublish(s.device, topic)
		default:
			ok = acl.CanSubscribe(s.device, topic)
		}
	}
	if !ok {
		h.denied(write)
	}
	return ok
}

// denied counts a publish (write) or subscription the ACL refused.
func (h *authHook) denied(write bool) {
	if write {
		h.pubDenied.Add(1)
	} else {
		h.subDenied.Add(1)
	}
}

// admitConn applies the per-address connection rate to a new connection.
func (h *authHook) admitConn(remote net.Addr) bool {
	cr := h.connect.Load()
	if cr.quota.Limit == 0 {
		return true
	}
	var ip netip.Addr
	if tcp, ok := remote.(*net.TCPAddr); ok {
		ip = tcp.AddrPort().Addr().Unmap()
	}
	for _, p := range cr.exempt {
		if p.Contains(ip) {
			return true
		}
	}
	if h.rate.AllowAt(remoteHost(remote.String()), cr.quota, h.clock.Now()).Allowed {
		return true
	}
	h.refused[refusedRate].Add(1)
	return false
}

// sweep forgets the sessions of closed clients and the rate windows of
// addresses that have gone quiet.
func (h *authHook) sweep(now devicelimit.Tick) {
	h.rate.Sweep(now)
}

func (h *authHook) stats() AuthStats {
	st := AuthStats{PublishDenied: h.pubDenied.Load(), SubscribeDenied: h.subDenied.Load(),
		ConnectsRefused: make(map[string]uint64, refusedReasons), ProtocolErrors: h.protocolErrors.Load()}
	st.ConsumersSpooled, st.ConsumerWaits = h.consumers.spooled.Load(), h.consumers.waits.Load()
	st.ConsumerWaitsExpired = h.consumers.expired.Load()
	st.ConsumerSpoolBytes = h.consumers.spoolBytes()
	for i, name := range refusedNames {
		st.ConnectsRefused[name] = h.refused[i].Load()
	}
	return st
}

// silentClosed counts a connection that never sent CONNECT, closed for
// why (pending.go), and logs each reason at most once per
// refusalLogWindow.
func (h *authHook) silentClosed(why int) {
	reason := refusedPendingFull + why
	n := h.refused[reason].Add(1)
	if h.logs.allow(logRefused, refusedNames[reason], refusalLogWindow) {
		msg := map[int]string{
			silentFull:    "silent connection closed: max_pending_connections connections had not sent CONNECT; the oldest made room",
			silentAddress: "silent connection closed: its address held max_pending_per_address connections that had not sent CONNECT; its oldest made room",
			silentTimeout: "silent connection closed: no CONNECT within the connect timeout",
		}[why]
		most, perAddress := h.pending.bounds()
		h.log.Warn(msg, "max_pending_connections", most, "max_pending_per_address", perAddress, "closed_so_far", n)
	}
}

// protocolRefused counts a connection ended for a packet the MQTT
// specification forbids, at CONNECT (refused as "protocol") or after
// (a protocol error), and logs it at most once per refusalLogWindow for
// each reason.
func (h *authHook) protocolRefused(remote string, atConnect bool, reason string) {
	var n uint64
	if atConnect {
		n = h.refused[refusedProtocol].Add(1)
	} else {
		n = h.protocolErrors.Add(1)
	}
	if h.logs.allow(logProtocol, reason, refusalLogWindow) {
		h.log.Warn("connection ended: protocol error", "reason", reason, "remote", remote, "at_connect", atConnect, "so_far", n)
	}
}
