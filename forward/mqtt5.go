package forward

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// dial5 connects to d's upstream over MQTT 5 with paho.golang.
//
// paho.golang's Publish either blocks until the acknowledgement (one
// message in flight at a time) or returns at once without telling when
// it is acknowledged. To keep a window in flight, in order, each Send
// publishes asynchronously from the forwarder's goroutine (so in
// order), and ackSession, wrapped around paho's own session state, hands
// the acknowledgement of that very packet to the Send's Ack.
func (d *MQTT) dial5(ctx context.Context, timeout, keepAlive time.Duration) (Conn, error) {
	nc, err := d.dial(ctx, timeout)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", d.Addr(), err)
	}
	conn := &mqtt5Conn{Ending: NewEnding(), bc: nc, sess: newAckSession()}
	cfg := paho.ClientConfig{ClientID: d.ClientID, Conn: pahoConn(nc), Session: conn.sess, PacketTimeout: timeout,
		OnClientError: conn.EndWith,
		OnServerDisconnect: func(dc *paho.Disconnect) {
			why := ""
			if dc.Properties != nil && dc.Properties.ReasonString != "" {
				why = ": " + dc.Properties.ReasonString
			}
			conn.EndWith(fmt.Errorf("the upstream disconnected, reason code 0x%02x%s", dc.ReasonCode, why))
		}}
	if len(d.Subscribe) > 0 && d.Deliver != nil {
		// A command is acknowledged once delivered, not when it arrives:
		// paho.golang then sends the acknowledgements in arrival order
		// (every 50 ms), holding back one acknowledged before an earlier
		// one that is not.
		cfg.EnableManualAcknowledgment = true
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			if d.deliver(pr.Packet.Topic, pr.Packet.Payload, pr.Packet.Retain, pr.Packet.QoS, conn.Ending) {
				return true, pr.Client.Ack(pr.Packet)
			}
			return true, nil
		}}
	}
	conn.c = paho.NewClient(cfg)
	cp := &paho.Connect{ClientID: d.ClientID, CleanStart: !d.Persistent, KeepAlive: uint16(keepAlive / time.Second),
		Properties: &paho.ConnectProperties{ReceiveMaximum: ptr(uint16(64))}}
	if d.Persistent {
		cp.Properties.SessionExpiryInterval = ptr(uint32(7 * 24 * 3600))
	}
	if d.Username != "" {
		cp.Username, cp.UsernameFlag = d.Username, true
		cp.Password, cp.PasswordFlag = []byte(d.Password), true
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ca, err := conn.c.Connect(cctx, cp)
	if err != nil {
		conn.sess.Close()
		nc.Close()
		if ca != nil && ca.ReasonCode >= 0x80 {
			return nil, fmt.Errorf("connect to %s: refused: %s (reason 0x%02X)", d.Addr(), reasonText(ca.Properties), ca.ReasonCode)
		}
		return nil, fmt.Errorf("connect to %s: %w", d.Addr(), err)
	}
	conn.receiveMax = 65535 // MQTT 5, 3.2.2.3.3: absent, 65,535
	if ca.Properties != nil && ca.Properties.ReceiveMaximum != nil {
		conn.receiveMax = int(*ca.Properties.ReceiveMaximum)
	}
	if len(d.Subscribe) > 0 && d.Deliver != nil {
		sub := &paho.Subscribe{}
		for _, s := range d.Subscribe {
			sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: s, QoS: 1})
		}
		subscribe := func(ctx context.Context) error {
			ctx, stop := untilEnded(ctx, conn.Ending)
			defer stop()
			sa, err := conn.c.Subscribe(ctx, sub)
			if why := conn.Reason(); err != nil && why != nil {
				err = fmt.Errorf("connection lost: %w", why) // rather than that the wait was cut short
			}
			if sa != nil { // with paho's "at least one requested subscription failed": say which
				var refused []string
				for i, r := range sa.Reasons {
					if r >= 0x80 && i < len(d.Subscribe) {
						refused = append(refused, fmt.Sprintf("%s (reason 0x%02X)", d.Subscribe[i], r))
					}
				}
				if len(refused) > 0 {
					err = fmt.Errorf("refused for %s", strings.Join(refused, ", "))
				}
			}
			if err != nil {
				return fmt.Errorf("subscribe upstream to %v: %w", d.Subscribe, err)
			}
			return nil
		}
		if ca.SessionPresent {
			subscribeKept(conn.Ending, func() error {
				// paho gives up on the SUBACK after its PacketTimeout (and
				// takes a late one quietly): only a refusal or a lost
				// connection ends this one.
				if err := subscribe(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
					return err
				}
				return nil
			})
		} else if err := subscribe(cctx); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return conn, nil
}

func ptr[T any](v T) *T { return &v }

// packetConn is the connection paho.golang writes to: a batchConn that
// is also a sync.Locker, which paho holds while it writes a packet.
// paho writes a packet as several Writes (its fixed header, then each
// part) and holds the writer across them only when it is a sync.Locker
// (packets.ControlPacket.WriteTo); on a bare TCP connection the parts
// leave in one writev, but a batchConn takes them one by one. Its
// goroutines write concurrently: the pinger sends its first PINGREQ as
// the connection starts, just when Dial sends the SUBSCRIBE (later
// PINGREQs, the acknowledgements of commands, the forwarder's
// publishes). Without the lock, a PINGREQ landed inside the SUBSCRIBE
// about once in 500 dials: mochi read a malformed SUBSCRIBE ("malformed
// packet: topic") and closed the connection.
type packetConn struct {
	*batchConn
	sync.Mutex
}

// pahoConn is nc as paho.golang's connection.
func pahoConn(nc *batchConn) net.Conn { return &packetConn{batchConn: nc} }

// untilEnded returns ctx, cancelled also when e ends. paho.golang does
// not always end a wait when the connection ends: with no session kept
// (session expiry 0), its session state forgets the packets awaiting an
// answer (state.State.clean, from connectionLost) without answering
// them, so a Subscribe waited for its whole timeout on a connection the
// upstream had closed.
func untilEnded(ctx context.Context, e *Ending) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-e.Lost():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func reasonText(p *paho.ConnackProperties) string {
	if p != nil && p.ReasonString != "" {
		return p.ReasonString
	}
	return "no reason given"
}

type mqtt5Conn struct {
	c    *paho.Client
	bc   *batchConn // the socket paho reads and writes
	sess *ackSession
	// receiveMax is the upstream's Receive Maximum (its CONNACK): the
	// QoS 1 publishes it takes unacknowledged. paho.golang's publish
	// waits for room beyond it.
	receiveMax int
	*Ending
}

// MaxInflight is the upstream's Receive Maximum: the pump keeps at most
// that many in flight, so that a Send never waits for room (and never
// while the pump holds the publishes that would make it: Hold).
func (c *mqtt5Conn) MaxInflight() int { return c.receiveMax }

// Hold and Release make mqtt5Conn a holder: the publishes of a batch
// leave in one write.
func (c *mqtt5Conn) Hold()    { c.bc.Hold() }
func (c *mqtt5Conn) Release() { c.bc.Release() }

func (c *mqtt5Conn) Send(m *Message, qos byte) Ack {
	a := NewPending()
	p := &paho.Publish{Topic: m.Topic, QoS: qos, Retain: m.Retain, Payload: m.Payload, Properties: props5(m.Props)}
	if m.ID != "" {
		// The message's ID, after the device's own user properties: a
		// reader drops a message whose ID it has seen (a resend, a
		// dead letter replayed twice).
		if p.Properties == nil {
			p.Properties = &paho.PublishProperties{}
		}
		p.Properties.User = append(p.Properties.User, paho.UserProperty{Key: IDProperty, Value: m.ID})
	}
	if qos > 0 {
		c.sess.next = a // read by AddToSession, in this goroutine
	}
	_, err := c.c.PublishWithOptions(context.Background(), p, paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
	c.sess.next = nil
	switch {
	case qos == 0:
		a.Finish(err)
	case err != nil && !errors.Is(err, paho.ErrNetworkErrorAfterStored):
		a.Finish(err) // never stored: no acknowledgement will come
	}
	return a
}

func (c *mqtt5Conn) Close() {
	_ = c.c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	_ = c.sess.Close() // paho closes only sessions it made; this ends the waits on acknowledgements
}

// IDProperty is the MQTT 5 user property that carries a message's ID
// upstream.
const IDProperty = "devicegate-id"

// props5 are p as paho.golang's publish properties.
func props5(p *Props) *paho.PublishProperties {
	if p == nil {
		return nil
	}
	out := &paho.PublishProperties{ContentType: p.ContentType, ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData}
	if p.HasPayloadFormat {
		out.PayloadFormat = ptr(p.PayloadFormat)
	}
	if p.MessageExpiry > 0 {
		out.MessageExpiry = ptr(p.MessageExpiry)
	}
	for _, u := range p.User {
		out.User = append(out.User, paho.UserProperty{Key: u.Key, Value: u.Value})
	}
	return out
}

// ack is the Ack of one MQTT 5 publish.
// ackSession is paho's session state, telling the Send that added a
// QoS 1 or 2 publish when the upstream acknowledged it.
type ackSession struct {
	session.SessionManager
	next *Pending // the Send in progress; set and read on the forwarder's goroutine
	// closed is closed by Close: paho.golang's session state, with no
	// session kept (session expiry 0), forgets the publishes awaiting
	// an acknowledgement when the connection goes (state.State.clean,
	// from connectionLost) without answering them, and its Close then
	// finds none to answer.
	closed    chan struct{}
	closeOnce sync.Once
}

func newAckSession() *ackSession {
	return &ackSession{SessionManager: state.NewInMemory(), closed: make(chan struct{})}
}

// Close closes the session state and ends every wait for an
// acknowledgement with ErrEnded.
func (s *ackSession) Close() error {
	err := s.SessionManager.Close()
	s.closeOnce.Do(func() { close(s.closed) })
	return err
}

func (s *ackSession) AddToSession(ctx context.Context, p session.Packet, resp chan<- packets.ControlPacket) error {
	a := s.next
	s.next = nil
	if a == nil {
		return s.SessionManager.AddToSession(ctx, p, resp)
	}
	mine := make(chan packets.ControlPacket, 1)
	if err := s.SessionManager.AddToSession(ctx, p, mine); err != nil {
		return err
	}
	go func() {
		var cp packets.ControlPacket
		select {
		case cp = <-mine:
		case <-s.closed:
			select {
			case cp = <-mine: // answered before the end
			default: // never answered: ErrEnded
			}
		}
		switch r := cp.Content.(type) {
		case *packets.Puback:
			a.Finish(pubackError(r.ReasonCode, r.Reason()))
		case *packets.Pubrec:
			a.Finish(pubackError(r.ReasonCode, ""))
		case *packets.Pubcomp:
			a.Finish(nil)
		default:
			a.Finish(ErrEnded)
		}
	}()
	return nil
}

// pubackError is the outcome of a PUBACK's or PUBREC's reason code:
// nil for success; a refusal for good (RefusedError) for the codes that
// say the same message would be refused again (not authorized, topic
// name invalid, packet too large, payload format invalid); a transient
// failure otherwise (unspecified, implementation specific, quota
// exceeded, packet identifier in use), sent again.
func pubackError(code byte, why string) error {
	if code < 0x80 {
		return nil
	}
	if why != "" {
		why = " " + why
	}
	err := fmt.Errorf("upstream refused the message: reason 0x%02X%s", code, why)
	if reason, ok := permanentCodes[code]; ok {
		return Refuse(reason, err)
	}
	return err
}

// permanentCodes are the MQTT 5 PUBACK/PUBREC reason codes that refuse
// a message for good, and their names in metrics.
var permanentCodes = map[byte]string{
	0x87: "not_authorized",
	0x90: "topic_name_invalid",
	0x95: "too_large",
	0x99: "payload_format_invalid",
}
