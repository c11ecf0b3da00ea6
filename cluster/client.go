package cluster

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config is how to reach Redis.
type Config struct {
	Addrs    []string
	Username string
	Password string
	TLS      bool
	DB       int
	// Timeout bounds every decision; see Options.Timeout.
	Timeout time.Duration
}

// controlTimeout bounds the calls off the publish path: override
// changes and the full resynchronisation of overrides.
const controlTimeout = 5 * time.Second

// NewClients returns two clients of the configured Redis (a cluster
// client when there are several addresses): one for decisions, whose
// every socket operation is bounded by cfg.Timeout and which never
// retries (a retry would exceed the timeout), and one for overrides
// and pub/sub, with longer timeouts.
func NewClients(cfg Config) (decisions, control redis.UniversalClient) {
	opts := func(timeout time.Duration, retries int) *redis.UniversalOptions {
		o := &redis.UniversalOptions{
			Addrs: cfg.Addrs, Username: cfg.Username, Password: cfg.Password, DB: cfg.DB,
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
			ContextTimeoutEnabled: true, MaxRetries: retries, DisableIdentity: true,
		}
		if cfg.TLS {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
			if len(cfg.Addrs) == 1 {
				o.TLSConfig.ServerName, _, _ = net.SplitHostPort(cfg.Addrs[0])
			}
		}
		return o
	}
	return redis.NewUniversalClient(opts(cfg.Timeout, -1)), redis.NewUniversalClient(opts(controlTimeout, 2))
}

// ClientOptions returns the options of a single-server decision client
// at addr, as NewClients makes them.
func ClientOptions(addr string, timeout time.Duration) *redis.Options {
	return &redis.Options{
		Addr: addr, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
		ContextTimeoutEnabled: true, MaxRetries: -1, DisableIdentity: true,
	}
}
