package simulator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	paho "github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// Auth is how the simulator's clients authenticate to a gateway with
// authentication on. The zero value connects as before: plain TCP, no
// username. Passwords are never written to a report.
type Auth struct {
	// Username and Password are sent by every device in its CONNECT,
	// and by the subscriber unless SubUsername is set.
	Username string `json:"username,omitempty"`
	Password string `json:"-"`
	// SubUsername and SubPassword are the subscriber's: with
	// authentication on it needs a consumer account, since a device
	// account may subscribe only to its own command topics.
	SubUsername string `json:"sub_username,omitempty"`
	SubPassword string `json:"-"`
	// SubClientID is the subscriber's client ID; default the
	// subscriber's username when it has one (an account's default
	// client ID), else "simulator-sub-" and a random suffix.
	SubClientID string `json:"sub_client_id,omitempty"`
	// TLS, when not nil, makes every client connect over TLS with it.
	TLS *tls.Config `json:"-"`
	// TLSOn records in the report that TLS was used.
	TLSOn bool `json:"tls,omitempty"`
	// source, when set, is the local address a device dials from
	// (Config.SourceAddrs).
	source *net.TCPAddr
}

// subCredentials returns the subscriber's username and password.
func (a Auth) subCredentials() (string, string) {
	if a.SubUsername != "" {
		return a.SubUsername, a.SubPassword
	}
	return a.Username, a.Password
}

// ErrConnectRefused wraps a CONNACK that refuses the client for who it
// is (bad username or password, client ID not allowed, not
// authorized): trying again cannot help.
var ErrConnectRefused = errors.New("refused at CONNECT")

// connackNames names the MQTT 5 reason codes of a refused CONNECT that
// are about the client's identity.
var connackNames = map[byte]string{
	0x85: "client identifier not valid",
	0x86: "bad username or password",
	0x87: "not authorized",
}

// refused5 turns a failed MQTT 5 connect into an error naming the
// CONNACK's reason code; identity refusals wrap ErrConnectRefused.
func refused5(ca *paho.Connack, err error) error {
	if ca == nil || ca.ReasonCode < 0x80 {
		return fmt.Errorf("connect: %w", err)
	}
	if ca.ReasonCode == 0x8A { // banned: automatic blocking
		return fmt.Errorf("%w: CONNACK 0x8A banned", ErrBlocked)
	}
	reason := ""
	name, known := connackNames[ca.ReasonCode]
	if ca.Properties != nil && ca.Properties.ReasonString != "" && ca.Properties.ReasonString != name {
		reason = ": " + ca.Properties.ReasonString
	}
	if known {
		return fmt.Errorf("%w: CONNACK 0x%02x %s%s", ErrConnectRefused, ca.ReasonCode, name, reason)
	}
	return fmt.Errorf("connect: CONNACK 0x%02x%s", ca.ReasonCode, reason)
}

// refused4 does the same for MQTT 3.1.1 return codes 2, 4 and 5.
func refused4(err error) error {
	for _, code := range []byte{packets.ErrRefusedIDRejected, packets.ErrRefusedBadUsernameOrPassword, packets.ErrRefusedNotAuthorised} {
		if errors.Is(err, packets.ConnErrors[code]) {
			return fmt.Errorf("%w: CONNACK return code %d %v", ErrConnectRefused, code, packets.ConnErrors[code])
		}
	}
	return fmt.Errorf("connect: %w", err)
}

// dialConn opens the connection to addr, over TLS when a.TLS is set,
// counting the bytes on it into w (nil: not counted).
func (a Auth) dialConn(ctx context.Context, addr string, w *wireCount) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	if a.source != nil {
		d.LocalAddr = a.source
	}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if a.TLS == nil {
		return w.wrap(raw), nil
	}
	cfg := a.TLS.Clone()
	if cfg.ServerName == "" { // as tls.Dialer does
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	conn := tls.Client(w.wrap(raw), cfg)
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := conn.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, err
	}
	return conn, nil
}

// deviceReceiveMaximum is the Receive Maximum a simulated device
// announces. paho.golang sizes a client's queue of incoming publishes by
// it (65535 slots, 512 KiB, when none is announced: 4.9 GiB for 10 000
// devices); a device receives nothing.
const deviceReceiveMaximum = 16

// connect5 fills an MQTT 5 CONNECT with the given credentials and, when
// not 0, Receive Maximum. The subscriber announces none: the gateway
// then sends it up to mqtt.max_inflight unacknowledged messages, and
// mochi's queue for clients that announce one loses send quota (see
// docs/security.md, Resource limits).
func connect5(id, username, password string, receiveMax uint16) *paho.Connect {
	c := &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}
	if receiveMax > 0 {
		c.Properties = &paho.ConnectProperties{ReceiveMaximum: &receiveMax}
	}
	if username != "" {
		c.Username, c.UsernameFlag = username, true
		c.Password, c.PasswordFlag = []byte(password), true
	}
	return c
}
