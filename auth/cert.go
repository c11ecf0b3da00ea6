package auth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// CertField names the part of a client certificate that identifies the
// device.
type CertField uint8

const (
	// CertCN is the subject's common name.
	CertCN CertField = iota
	// CertDNS is the first DNS name SAN.
	CertDNS
	// CertEmail is the first e-mail address SAN.
	CertEmail
	// CertURI is the first URI SAN.
	CertURI
)

// ParseCertField accepts cn, dns, email and uri.
func ParseCertField(s string) (CertField, error) {
	switch s {
	case "cn":
		return CertCN, nil
	case "dns":
		return CertDNS, nil
	case "email":
		return CertEmail, nil
	case "uri":
		return CertURI, nil
	}
	return 0, fmt.Errorf("must be cn, dns, email or uri (got %q)", s)
}

// String returns the name ParseCertField accepts.
func (f CertField) String() string {
	return [...]string{"cn", "dns", "email", "uri"}[f]
}

// Identity returns the identity the certificate gives under f.
func (f CertField) Identity(c *x509.Certificate) (string, error) {
	var id string
	switch f {
	case CertCN:
		id = c.Subject.CommonName
	case CertDNS:
		if len(c.DNSNames) > 0 {
			id = c.DNSNames[0]
		}
	case CertEmail:
		if len(c.EmailAddresses) > 0 {
			id = c.EmailAddresses[0]
		}
	case CertURI:
		if len(c.URIs) > 0 {
			id = c.URIs[0].String()
		}
	}
	if id == "" {
		return "", fmt.Errorf("%w: no %s in the certificate of %q", ErrNoIdentity, f, c.Subject.String())
	}
	return id, nil
}

// ServerTLS builds the TLS configuration of a listener: the certificate
// and key files (PEM), TLS 1.2 at least. With clientCAFile, client
// certificates are verified against the CAs in it: required when
// requireClientCert, else verified when given.
func ServerTLS(certFile, keyFile, clientCAFile string, requireClientCert bool) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load certificate %s and key %s: %w", certFile, keyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if clientCAFile != "" {
		pool, err := LoadCAPool(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("client CA: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if requireClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return cfg, nil
}

// LoadCAPool reads a PEM file of CA certificates into a pool; a file
// without a PEM certificate is an error naming it.
func LoadCAPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// ClientTLS builds the TLS configuration of a connection the gateway
// opens (an upstream broker): TLS 1.2 at least; the server's certificate
// checked against the CAs in caFile (the system's when empty) for
// serverName; with certFile and keyFile, the client certificate of
// mutual TLS.
func ClientTLS(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pool, err := LoadCAPool(caFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file %s and key_file %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
