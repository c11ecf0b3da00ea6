package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/config"
)

// ErrReloadRefused wraps a reload refused because the file changes keys
// that cannot change without a restart; nothing was changed.
var ErrReloadRefused = admin.ErrReloadRefused

// ErrReloadInvalid wraps a reload of a file that does not parse or
// validate, or whose certificate, credentials file or forward
// destination's secrets (password file or variable, client
// certificate) cannot be read; nothing was changed.
var ErrReloadInvalid = errors.New("configuration not reloaded")

// newReloadCounter counts reloads by result: ok, refused (a key that
// cannot reload changed) or invalid.
func newReloadCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "devicegate_config_reloads_total",
		Help: "Configuration reloads (SIGHUP, POST /api/v1/reload), by result: ok, refused (a key that needs a restart changed) or invalid (the file does not parse or validate). Nothing changes unless ok.",
	}, []string{"result"})
	for _, r := range []string{"ok", "refused", "invalid"} {
		c.WithLabelValues(r)
	}
	return c
}

// ReloadFromSource reads the configuration again (Deps.Load: the file
// and the command line's flags) and reloads it (Reload). Reloads take
// turns: one asked for during another waits for it, then reads the
// file. The file is read in its turn, not before: read before, it could
// be put in force after a newer file a later reload read and applied
// (two operators reloading at once: the older file won, each told its
// own was applied).
func (g *Gateway) ReloadFromSource() ([]config.Change, error) {
	if g.load == nil {
		return nil, fmt.Errorf("%w: this gateway has no configuration source to read again", ErrReloadInvalid)
	}
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	next, err := g.load()
	if err != nil {
		g.reloads.WithLabelValues("invalid").Inc()
		g.log.Error("configuration not reloaded; the running configuration stays", "error", err)
		return nil, fmt.Errorf("%w: %w", ErrReloadInvalid, err)
	}
	return g.reload(next)
}

// Reload puts next in force without a restart, as a whole or not at
// all. It is refused (ErrReloadRefused) when next changes a key that
// cannot reload (config.Reloadable), naming each with both values; it
// fails (ErrReloadInvalid) when a file next names cannot be read. Else
// the default quota, rules, classes and groups apply from each device's
// next message, their windows keeping their counts; the log level
// changes; the TLS certificate and key, and the credentials file, are
// read again, for the connections and logins that come after; the topic
// ACL applies from the next publish, subscription and delivery; the
// connection rate and the bounds of silent connections from the next
// connection accepted; the consumers from the next CONNECT; each forward
// destination's rate, max_age and max_bytes at once, its credentials
// (read again, with its password file and client certificate) from its
// next connection. next must have passed Validate. It returns the keys
// that changed. One reload at a time: it waits for one under way.
func (g *Gateway) Reload(next config.Config) ([]config.Change, error) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	return g.reload(next)
}

// reload is Reload, g.reloadMu held.
func (g *Gateway) reload(next config.Config) ([]config.Change, error) {
	log := g.log
	changes, err := config.ReloadChanges(g.cfg, next)
	if err != nil {
		g.reloads.WithLabelValues("refused").Inc()
		log.Error("configuration not reloaded: it changes keys that need a restart; the running configuration stays", "error", oneLine(err))
		return nil, fmt.Errorf("%w: %w", ErrReloadRefused, err)
	}
	// Everything is built before anything is applied.
	res, err := next.Resolver()
	var cert *tls.Certificate
	if err == nil && g.cert != nil {
		var c tls.Certificate
		if c, err = tls.LoadX509KeyPair(next.MQTT.TLS.CertFile, next.MQTT.TLS.KeyFile); err != nil {
			err = fmt.Errorf("mqtt.tls: load certificate %s and key %s: %w", next.MQTT.TLS.CertFile, next.MQTT.TLS.KeyFile, err)
		}
		cert = &c
	}
	var creds *auth.Credentials
	if err == nil && next.Auth.CredentialsFile != "" {
		if creds, err = auth.LoadFile(next.Auth.CredentialsFile); err != nil {
			err = fmt.Errorf("auth.credentials_file: %w", err)
		}
	}
	var acl auth.ACL
	if err == nil && !next.AllowAll() {
		acl, err = topicACL(next)
	}
	var limits broker.Limits
	if err == nil {
		limits, err = brokerLimits(next)
	}
	var setForward func()
	if err == nil {
		setForward, err = g.reloadForward(next)
	}
	// The broker's limits refuse what they would at start, changing
	// nothing; the rules are put in force after them, and should they
	// fail, the limits are put back.
	if err == nil {
		err = g.srv.SetLimits(limits)
	}
	if err == nil {
		if err = g.resolver.Reconfigure(res); err != nil {
			if lerr := g.srv.SetLimits(g.limits); lerr != nil {
				err = errors.Join(err, lerr)
			}
		}
	}
	if err != nil {
		g.reloads.WithLabelValues("invalid").Inc()
		log.Error("configuration not reloaded; the running configuration stays", "error", err)
		return nil, fmt.Errorf("%w: %w", ErrReloadInvalid, err)
	}
	conns := g.srv.Reconfigure()
	g.limits = limits
	if err := g.srv.SetACL(acl); err != nil {
		log.Error("topic ACL not reloaded; the ACL loaded before stays in force", "error", err) // built from a valid auth.acl: not seen
	}
	setForward()
	if g.level != nil {
		g.level.Set(next.Log.Level)
	}
	if cert != nil {
		g.cert.Store(cert)
	}
	if creds != nil {
		if err := g.srv.SetCredentials(creds); err != nil {
			log.Error("credentials not reloaded; the accounts loaded before stay in force", "error", err)
		}
	}
	g.cfg = next
	g.reloads.WithLabelValues("ok").Inc()
	keys := make([]string, len(changes))
	for i, c := range changes {
		keys[i] = c.String()
	}
	args := []any{"changes", len(changes), "connections", conns}
	if creds != nil {
		args = append(args, "accounts", creds.Len())
	}
	if n := len(g.forwardConns); n > 0 {
		// Their credentials were read again whether a key changed or not.
		args = append(args, "forward_upstreams", n)
	}
	if len(keys) > 0 {
		args = append(args, "changed", strings.Join(keys, "; "))
	}
	log.Info("configuration reloaded", args...)
	warnIdleACL(log, next, changes)
	return changes, nil
}

// warnIdleACL warns when a reload changed auth.acl while authentication
// is off: allow-all applies no topic ACL, so the change does nothing.
func warnIdleACL(log *slog.Logger, next config.Config, changes []config.Change) {
	if !next.AllowAll() || !slices.ContainsFunc(changes, func(c config.Change) bool { return strings.HasPrefix(c.Key, "auth.acl.") }) {
		return
	}
	log.Warn("auth.acl changed but applies to nothing: authentication is off (allow-all), and then no topic ACL is checked; set auth.credentials_file or mqtt.tls.client_ca_file",
		"acl_publish", next.Auth.ACL.Publish, "acl_subscribe", next.Auth.ACL.Subscribe)
}

// reloadOnHangup reloads the configuration on every SIGHUP until ctx
// ends.
func (g *Gateway) reloadOnHangup(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			g.log.Info("SIGHUP: reloading the configuration")
			_, _ = g.ReloadFromSource() // logged
		}
	}()
}

// oneLine joins a joined error's lines with "; " for a log line.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// adminReload is POST /api/v1/reload's.
func (g *Gateway) adminReload() ([]admin.ReloadChange, error) {
	changes, err := g.ReloadFromSource()
	out := make([]admin.ReloadChange, len(changes))
	for i, c := range changes {
		out[i] = admin.ReloadChange(c)
	}
	return out, err
}
