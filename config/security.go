package config

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/devicelimit"
)

// Defaults of the security and resource keys.
const (
	DefaultMaxPacketSize     = 256 << 10
	DefaultMaxClientIDLength = 256
	DefaultMaxConnections    = 50000
	DefaultMaxPendingWrites  = broker.DefaultMaxPendingWrites
	DefaultMaxInflight       = broker.DefaultMaxInflight
	DefaultMaxPendingConns   = broker.DefaultMaxPendingConnections
	DefaultMaxPendingPerAddr = broker.DefaultMaxPendingPerAddress
	DefaultMaxDevices        = 1_000_000
	DefaultConnectRateLimit  = 100
	DefaultKeepaliveMax      = time.Hour
	DefaultTopicAliasMaximum = broker.DefaultTopicAliasMaximum
)

// TLS configures the MQTT over TLS listener.
type TLS struct {
	// Addr is the listener's host:port; empty: no TLS listener.
	Addr string `yaml:"addr"`
	// CertFile and KeyFile are the gateway's PEM certificate (chain)
	// and private key.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile holds the PEM CAs whose client certificates
	// authenticate devices; setting it turns certificate auth on.
	ClientCAFile string `yaml:"client_ca_file"`
}

// WebSocket configures the MQTT over WebSocket listener.
type WebSocket struct {
	// Addr is the listener's host:port; empty: no WebSocket listener.
	Addr string `yaml:"addr"`
	// TLS serves WebSocket over TLS (wss) with mqtt.tls's certificate.
	TLS bool `yaml:"tls"`
}

// Rate is "Limit events per Window" per source address, except for the
// addresses in Exempt (CIDR prefixes such as "10.0.0.0/8").
type Rate struct {
	Limit  int      `yaml:"limit"`
	Window Duration `yaml:"window"`
	Exempt []string `yaml:"exempt"`
}

// Consumers names the backend consumers: the clients that subscribe to
// what many devices publish. Each gets a write spool of WriteBuffer
// bytes, and publishers wait for its writer when it falls behind
// (broker/consumers.go).
type Consumers struct {
	ClientIDs   []string `yaml:"client_ids"`
	WriteBuffer Size     `yaml:"write_buffer"`
}

// Bounds of mqtt.consumers.write_buffer.
const (
	MinConsumerWriteBuffer = 64 << 10
	MaxConsumerWriteBuffer = 1 << 30
)

// Keepalive bounds the keepalive a client may ask for; 0s is no bound.
type Keepalive struct {
	Min Duration `yaml:"min"`
	Max Duration `yaml:"max"`
}

// AdminTLS serves the admin API over HTTPS when both files are set.
type AdminTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Auth configures device authentication and the topic ACL.
type Auth struct {
	// CredentialsFile is the accounts file "gateway passwd" writes;
	// setting it turns password auth on.
	CredentialsFile string `yaml:"credentials_file"`
	// CertificateIdentity is the part of a client certificate that
	// names the device: cn, dns, email or uri.
	CertificateIdentity string `yaml:"certificate_identity"`
	// ACL holds the devices' topic templates.
	ACL ACL `yaml:"acl"`
}

// ACL holds the topic templates of devices; {device} stands for the
// device as a whole topic level.
type ACL struct {
	Publish   string `yaml:"publish"`
	Subscribe string `yaml:"subscribe"`
}

// withSecurityDefaults sets the defaults of the listener, auth and
// resource keys in c.
func withSecurityDefaults(c Config) Config {
	c.MQTT.MaxPacketSize = DefaultMaxPacketSize
	c.MQTT.MaxClientIDLength = DefaultMaxClientIDLength
	c.MQTT.MaxConnections = DefaultMaxConnections
	c.MQTT.MaxPendingWrites = DefaultMaxPendingWrites
	c.MQTT.Consumers = Consumers{ClientIDs: []string{}, WriteBuffer: broker.DefaultConsumerWriteBuffer}
	c.MQTT.MaxInflight = DefaultMaxInflight
	c.MQTT.MaxPendingConnections = DefaultMaxPendingConns
	c.MQTT.MaxPendingPerAddress = DefaultMaxPendingPerAddr
	c.MQTT.ConnectRate = Rate{Limit: DefaultConnectRateLimit, Window: Duration(time.Second), Exempt: []string{"127.0.0.0/8", "::1/128"}}
	c.MQTT.Keepalive = Keepalive{Max: Duration(DefaultKeepaliveMax)}
	c.MQTT.TopicAliasMaximum = DefaultTopicAliasMaximum
	c.Limits.MaxDevices = DefaultMaxDevices
	c.Auth = Auth{CertificateIdentity: "cn", ACL: ACL{Publish: auth.DefaultPublish, Subscribe: auth.DefaultSubscribe}}
	return c
}

// AllowAll reports whether no authentication is configured: every
// client gets in and may use every topic.
func (c Config) AllowAll() bool {
	return c.Auth.CredentialsFile == "" && c.MQTT.TLS.ClientCAFile == ""
}

// ConnectRate returns mqtt.connect_rate as a quota; the zero Quota when
// its limit is 0 (off).
func (c Config) ConnectRate() devicelimit.Quota {
	if c.MQTT.ConnectRate.Limit == 0 {
		return devicelimit.Quota{}
	}
	return devicelimit.Quota{Limit: c.MQTT.ConnectRate.Limit, Window: time.Duration(c.MQTT.ConnectRate.Window)}
}

// ConnectRateExempt returns mqtt.connect_rate.exempt, which must be
// valid (see Validate).
func (c Config) ConnectRateExempt() ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(c.MQTT.ConnectRate.Exempt))
	for i, s := range c.MQTT.ConnectRate.Exempt {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("mqtt.connect_rate.exempt[%d]: must be an address prefix such as \"10.0.0.0/8\" or \"::1/128\" (got %q)", i, s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// validateSecurity checks the listener, auth and resource keys.
func (c Config) validateSecurity(v *validator) {
	m := c.MQTT
	if m.TCP == "" && m.TLS.Addr == "" && m.WebSocket.Addr == "" {
		v.add("mqtt.tcp", `must be host:port such as ":1883" when neither mqtt.tls.addr nor mqtt.websocket.addr is set (got "")`)
	}
	if m.TLS.Addr != "" {
		v.tcp("mqtt.tls.addr", m.TLS.Addr)
	}
	if m.WebSocket.Addr != "" {
		v.tcp("mqtt.websocket.addr", m.WebSocket.Addr)
	}
	needCert := m.TLS.Addr != "" || m.WebSocket.TLS
	if needCert {
		if m.TLS.CertFile == "" {
			v.add("mqtt.tls.cert_file", "must name the gateway's PEM certificate when a TLS listener is on")
		}
		if m.TLS.KeyFile == "" {
			v.add("mqtt.tls.key_file", "must name the gateway's PEM private key when a TLS listener is on")
		}
	}
	if m.TLS.ClientCAFile != "" && m.TLS.Addr == "" && !m.WebSocket.TLS {
		v.add("mqtt.tls.client_ca_file", "client certificates need a TLS listener: set mqtt.tls.addr")
	}
	if m.WebSocket.TLS && m.WebSocket.Addr == "" {
		v.add("mqtt.websocket.tls", "needs mqtt.websocket.addr")
	}
	if m.MaxPacketSize < 64 || m.MaxPacketSize > 256<<20 {
		v.add("mqtt.max_packet_size", fmt.Sprintf("must be between 64B and 256MiB (got %s)", m.MaxPacketSize))
	}
	if m.MaxClientIDLength < 1 || m.MaxClientIDLength > devicelimit.MaxDeviceID {
		v.add("mqtt.max_client_id_length", fmt.Sprintf("must be between 1 and %d (got %d)", devicelimit.MaxDeviceID, m.MaxClientIDLength))
	}
	if m.MaxPendingConnections < 1 {
		v.add("mqtt.max_pending_connections", fmt.Sprintf("must be at least 1 (got %d)", m.MaxPendingConnections))
	}
	if m.MaxPendingPerAddress < 1 {
		v.add("mqtt.max_pending_per_address", fmt.Sprintf("must be at least 1 (got %d)", m.MaxPendingPerAddress))
	}
	if m.MaxInflight < 1 || m.MaxInflight > 65535 {
		v.add("mqtt.max_inflight", fmt.Sprintf("must be between 1 and 65535 (got %d)", m.MaxInflight))
	}
	if m.TopicAliasMaximum < 0 || m.TopicAliasMaximum > 65535 {
		v.add("mqtt.topic_alias_maximum", fmt.Sprintf("must be between 0 and 65535, 0 for none (got %d)", m.TopicAliasMaximum))
	}
	if m.MaxPendingWrites < 1 || m.MaxPendingWrites > 1<<20 {
		v.add("mqtt.max_pending_writes", fmt.Sprintf("must be between 1 and %d (got %d)", 1<<20, m.MaxPendingWrites))
	}
	if b := m.Consumers.WriteBuffer; b < MinConsumerWriteBuffer || b > MaxConsumerWriteBuffer {
		v.add("mqtt.consumers.write_buffer", fmt.Sprintf("must be between %s and %s (got %s)", Size(MinConsumerWriteBuffer), Size(MaxConsumerWriteBuffer), b))
	}
	for i, p := range m.Consumers.ClientIDs {
		if _, err := devicelimit.CompileGlob(p); err != nil {
			v.add(fmt.Sprintf("mqtt.consumers.client_ids[%d]", i), err.Error())
		}
	}
	if m.MaxConnections < 0 {
		v.add("mqtt.max_connections", fmt.Sprintf("must be >= 0, 0 for no bound (got %d)", m.MaxConnections))
	}
	if r := m.ConnectRate; r.Limit != 0 { // 0 turns the rate off
		q := devicelimit.Quota{Limit: r.Limit, Window: time.Duration(r.Window)}
		if err := q.Validate(auth.ConnectRateBuckets); err != nil {
			v.field("mqtt.connect_rate", err)
		}
	}
	if _, err := c.ConnectRateExempt(); err != nil {
		msg := err.Error()
		key, rest, _ := strings.Cut(msg, ": ")
		v.add(key, rest)
	}
	lo, hi := time.Duration(m.Keepalive.Min), time.Duration(m.Keepalive.Max)
	for key, d := range map[string]time.Duration{"mqtt.keepalive.min": lo, "mqtt.keepalive.max": hi} {
		if d < 0 || d > 65535*time.Second || d%time.Second != 0 {
			v.add(key, fmt.Sprintf("must be whole seconds between 0s and 65535s (got %q)", d.String()))
		}
	}
	if hi > 0 && lo > hi {
		v.add("mqtt.keepalive.min", fmt.Sprintf("must be at most mqtt.keepalive.max, %s (got %q)", hi, lo.String()))
	}
	if c.Limits.MaxDevices < 0 {
		v.add("limits.max_devices", fmt.Sprintf("must be >= 0, 0 for no bound (got %d)", c.Limits.MaxDevices))
	}
	if (c.Admin.TLS.CertFile == "") != (c.Admin.TLS.KeyFile == "") {
		v.add("admin.tls", "needs both cert_file and key_file, or neither")
	}
	if _, err := auth.ParseCertField(c.Auth.CertificateIdentity); err != nil {
		v.add("auth.certificate_identity", err.Error())
	}
	if err := auth.CheckTemplate(c.Auth.ACL.Publish); err != nil {
		v.add("auth.acl.publish", trimSentinel(err, auth.ErrInvalidTemplate))
	}
	if err := auth.CheckTemplate(c.Auth.ACL.Subscribe); err != nil {
		v.add("auth.acl.subscribe", trimSentinel(err, auth.ErrInvalidTemplate))
	}
}
