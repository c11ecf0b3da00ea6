package server

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/config"
)

// security is what the broker takes from the auth, TLS and resource
// keys of the configuration.
type security struct {
	auth   broker.Auth
	tls    *tls.Config // nil without a TLS listener
	limits broker.Limits
	// cert is the certificate tls serves (its GetCertificate), which a
	// reload replaces for the connections that come after.
	cert *atomic.Pointer[tls.Certificate]
}

// loadSecurity reads the credentials file and the TLS files that cfg
// names. cfg must have passed Validate.
func loadSecurity(cfg config.Config) (security, error) {
	var s security
	m := cfg.MQTT
	if m.TLS.Addr != "" || m.WebSocket.TLS {
		// Without a credentials file, a certificate is the only way in:
		// ask for it in the handshake. With one, a client may use either.
		var err error
		s.tls, err = auth.ServerTLS(m.TLS.CertFile, m.TLS.KeyFile, m.TLS.ClientCAFile, cfg.Auth.CredentialsFile == "")
		if err != nil {
			return security{}, fmt.Errorf("mqtt.tls: %w", err)
		}
		cert := new(atomic.Pointer[tls.Certificate])
		cert.Store(&s.tls.Certificates[0])
		s.tls.Certificates = nil
		s.tls.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil }
		s.cert = cert
	}
	if !cfg.AllowAll() {
		acl, err := topicACL(cfg)
		if err != nil {
			return security{}, err
		}
		field, err := auth.ParseCertField(cfg.Auth.CertificateIdentity)
		if err != nil {
			return security{}, fmt.Errorf("auth.certificate_identity: %w", err)
		}
		s.auth = broker.Auth{Certificates: m.TLS.ClientCAFile != "", CertField: field, ACL: acl}
		if cfg.Auth.CredentialsFile != "" {
			if s.auth.Credentials, err = auth.LoadFile(cfg.Auth.CredentialsFile); err != nil {
				return security{}, fmt.Errorf("auth.credentials_file: %w", err)
			}
		}
	}
	var err error
	if s.limits, err = brokerLimits(cfg); err != nil {
		return security{}, err
	}
	return s, nil
}

// brokerLimits returns the broker's limits of cfg's resource keys.
func brokerLimits(cfg config.Config) (broker.Limits, error) {
	m := cfg.MQTT
	exempt, err := cfg.ConnectRateExempt()
	if err != nil {
		return broker.Limits{}, err
	}
	l := broker.Limits{
		ConnectRateExempt:     exempt,
		MaxPacketSize:         uint32(m.MaxPacketSize),
		MaxClientIDLength:     m.MaxClientIDLength,
		MaxConnections:        m.MaxConnections,
		MaxPendingWrites:      m.MaxPendingWrites,
		Consumers:             m.Consumers.ClientIDs,
		ConsumerWriteBuffer:   int(m.Consumers.WriteBuffer),
		MaxInflight:           m.MaxInflight,
		MaxPendingConnections: m.MaxPendingConnections,
		MaxPendingPerAddress:  m.MaxPendingPerAddress,
		MaxDevices:            cfg.Limits.MaxDevices,
		ConnectRate:           cfg.ConnectRate(),
		KeepaliveMin:          time.Duration(m.Keepalive.Min),
		KeepaliveMax:          time.Duration(m.Keepalive.Max),
		TopicAliasMaximum:     m.TopicAliasMaximum,
	}
	if m.TopicAliasMaximum == 0 {
		l.TopicAliasMaximum = -1 // none; broker.Limits' 0 is its default
	}
	return l, nil
}

// topicACL returns cfg's topic ACL (auth.acl).
func topicACL(cfg config.Config) (auth.ACL, error) {
	acl, err := auth.NewACL(cfg.Auth.ACL.Publish, cfg.Auth.ACL.Subscribe)
	if err != nil {
		return auth.ACL{}, fmt.Errorf("auth.acl: %w", err)
	}
	return acl, nil
}

// logSecurity says at start-up which auth mode is on; allow-all gets a
// warning.
func logSecurity(log *slog.Logger, cfg config.Config, s security) {
	if cfg.AllowAll() {
		log.Warn("authentication is off (allow-all): any client may connect as any device and publish to any topic; set auth.credentials_file or mqtt.tls.client_ca_file")
		return
	}
	args := []any{"acl_publish", cfg.Auth.ACL.Publish, "acl_subscribe", cfg.Auth.ACL.Subscribe}
	if s.auth.Credentials != nil {
		args = append(args, "credentials_file", cfg.Auth.CredentialsFile, "accounts", s.auth.Credentials.Len())
		warnReadableCredentials(log, cfg.Auth.CredentialsFile)
	}
	if s.auth.Certificates {
		args = append(args, "client_ca_file", cfg.MQTT.TLS.ClientCAFile, "certificate_identity", cfg.Auth.CertificateIdentity)
	}
	log.Info("authentication on", args...)
}

// LogListeners logs the address of each MQTT listener.
func (g *Gateway) LogListeners() {
	log := g.log
	if a := g.Addr(); a != nil {
		log.Info("mqtt listening", "addr", a.String())
	}
	if a := g.srv.TLSAddr(); a != nil {
		log.Info("mqtt tls listening", "addr", a.String())
	}
	if a := g.srv.WebSocketAddr(); a != nil {
		log.Info("mqtt websocket listening", "addr", a.String())
	}
}

// warnReadableCredentials warns when users other than the file's owner
// may read the credentials file: whoever reads it can attack the hashes
// offline. (LoadFile refuses a file anyone may write.)
func warnReadableCredentials(log *slog.Logger, path string) {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o077 == 0 {
		return // loaded a moment ago; a stat error now is not worth a warning
	}
	log.Warn("credentials file readable by group or others: its password hashes can be attacked offline; chmod 600 it",
		"credentials_file", path, "mode", fi.Mode().Perm().String())
}
