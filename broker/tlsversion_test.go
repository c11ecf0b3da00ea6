package broker

import (
	"crypto/tls"
	"testing"
)

// TestTLSMinimumVersion: the TLS and the WebSocket TLS listener both
// refuse a client that offers at most TLS 1.1, and take TLS 1.2.
func TestTLSMinimumVersion(t *testing.T) {
	ca := newCA(t, "fleet CA")
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.TLSAddr = "127.0.0.1:0"
		o.WebSocketAddr, o.WebSocketTLS = "127.0.0.1:0", true
		o.TLS = serverTLS(t, ca, false)
	}})
	for _, l := range []struct {
		name string
		dial func(*tls.Config) error
	}{
		{"tls", func(c *tls.Config) error {
			conn, err := dialTLS(t, f.srv.TLSAddr().String(), c)
			if err == nil {
				conn.Close()
			}
			return err
		}},
		{"wss", func(c *tls.Config) error {
			conn, err := dialWSS(t, f.srv.WebSocketAddr().String(), c)
			if err == nil {
				conn.Close()
			}
			return err
		}},
	} {
		old := clientTLS(ca)
		old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
		if err := l.dial(old); err == nil {
			t.Errorf("%s: a TLS 1.1 client completed the handshake", l.name)
		} else {
			t.Logf("%s: %v", l.name, err)
		}
		cur := clientTLS(ca)
		cur.MaxVersion = tls.VersionTLS12
		if err := l.dial(cur); err != nil {
			t.Errorf("%s: TLS 1.2: %v", l.name, err)
		}
	}
}
