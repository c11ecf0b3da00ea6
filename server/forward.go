package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/auth"
	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/forward"
	"github.com/devicegate/devicegate/forward/kafka"
	"github.com/devicegate/devicegate/forward/natsjs"
	"github.com/devicegate/devicegate/forward/redisstream"
	"github.com/devicegate/devicegate/persist"
)

// forwardConn is a forwarder of a forward: entry and how its dialer was
// made (dialers), so that a reload can make it again.
type forwardConn struct {
	f        *forward.Forwarder
	n        int
	suffixed bool
}

// newForward builds the forwarders of every forward: upstream, each
// connection over its forward log in the data file ("NAME/I"; Start runs
// them); nil without any. A log left from a larger connections count
// gets a forwarder that drains it. conns lists the forwarders of each
// entry.
func newForward(cfg config.Config, store *persist.Store, log *slog.Logger, now func() time.Time,
	deliver func(topic string, payload []byte, retain bool, qos byte) error) (_ *forward.Set, conns [][]forwardConn, _ error) {
	// The logs holding messages or dead letters: each needs an entry
	// (or an adopting one), even with no forward: at all.
	logs, err := store.HeldLogs()
	if err != nil {
		return nil, nil, err
	}
	if err := stranded(cfg, store, logs); err != nil {
		return nil, nil, err
	}
	if len(cfg.Forward) == 0 {
		return nil, nil, nil
	}
	host := forwardHost()
	origin, err := store.Origin()
	if err != nil {
		return nil, nil, err
	}
	routes := make([]forward.Route, 0, len(cfg.Forward))
	for i, fc := range cfg.Forward {
		key := fmt.Sprintf("forward[%d]", i)
		dial, err := dialers(fc, host, deliver, log)
		if err != nil {
			return nil, nil, fmt.Errorf("%s.%w", key, err)
		}
		count := max(fc.Connections, 1)
		route := forward.Route{Filters: fc.Topics}
		conns = append(conns, nil)
		var buildAs func(name string, n int, drain bool) (*forward.Forwarder, error)
		build := func(n int, drain bool) (*forward.Forwarder, error) {
			return buildAs(fc.Name+"/"+strconv.Itoa(n), n, drain)
		}
		buildAs = func(name string, n int, drain bool) (*forward.Forwarder, error) {
			suffixed := count > 1 || drain
			l := forwardLive(fc, dial(n, suffixed))
			c := forward.Config{Name: name, Origin: origin, Upstream: fc.Name, Dial: l.Dial,
				Map: forward.Map{Local: fc.LocalPrefix, Remote: fc.RemotePrefix}, MaxQoS: byte(fc.MaxQoS), Window: fc.Inflight(),
				MaxBytes: l.MaxBytes, Overflow: overflow(fc.Overflow), MaxAge: l.MaxAge, Rate: l.Rate, MaxBackoff: time.Duration(fc.MaxBackoff), Now: now,
				DeadAfterCloses: fc.Closes()}
			f, err := forward.New(c, store, log)
			if err == nil {
				conns[len(conns)-1] = append(conns[len(conns)-1], forwardConn{f, n, suffixed})
			}
			return f, err
		}
		for n := range count {
			f, err := build(n, false)
			if err != nil {
				return nil, nil, err
			}
			route.Conns = append(route.Conns, f)
		}
		for _, name := range logs {
			rest, ok := strings.CutPrefix(name, fc.Name+"/")
			if n, err := strconv.Atoi(rest); ok && err == nil && n >= count {
				f, err := build(n, true)
				if err != nil {
					return nil, nil, err
				}
				route.Drain = append(route.Drain, f)
				log.Warn("forward log of a connection no longer configured: draining it", "upstream", fc.Name, "log", name)
			}
		}
		for _, name := range logs {
			if !adopts(fc, name) {
				continue
			}
			// A connection of its own, numbered after this entry's
			// (its MQTT client ID too).
			f, err := buildAs(name, count+len(route.Drain), true)
			if err != nil {
				return nil, nil, err
			}
			route.Drain = append(route.Drain, f)
			log.Warn("forward log of a former entry: sending it through this one", "upstream", fc.Name, "log", name)
		}
		routes = append(routes, route)
		log.Info("forwarding upstream", "name", fc.Name, "to", fc.To, "topics", strings.Join(fc.Topics, ","), "connections", count)
	}
	return forward.NewSet(routes), conns, nil
}

// forwardHost is the host name in upstream client IDs, made a topic
// level.
func forwardHost() string {
	host, _ := os.Hostname()
	return strings.NewReplacer("/", "-", "+", "-", "#", "-").Replace(host)
}

// forwardLive returns what a reload may change of fc's connections, with
// dial, one of them's dialer.
func forwardLive(fc config.Forward, dial forward.Dialer) forward.Live {
	l := forward.Live{Dial: dial, MaxBytes: int64(fc.MaxBytes), MaxAge: time.Duration(fc.MaxAge)}
	if fc.Rate != nil {
		l.Rate = *fc.Rate
	}
	return l
}

// reloadForward builds, for a reload to next, each forwarder's
// forward.Live: its destination's credentials read again (password
// files, client certificates), the rate, max_age and max_bytes. Nothing
// is applied: the caller applies them all (forward.Forwarder.SetLive)
// once every part of the reload is built. The error names the key.
func (g *Gateway) reloadForward(next config.Config) (func(), error) {
	host := forwardHost()
	type set struct {
		f *forward.Forwarder
		l forward.Live
	}
	var sets []set
	for i, conns := range g.forwardConns {
		fc := next.Forward[i] // a reload changes neither the entries nor their order
		dial, err := dialers(fc, host, g.srv.Publish, g.log)
		if err != nil {
			return nil, fmt.Errorf("forward[%d].%w", i, err)
		}
		for _, c := range conns {
			sets = append(sets, set{c.f, forwardLive(fc, dial(c.n, c.suffixed))})
		}
	}
	return func() {
		for _, s := range sets {
			if err := s.f.SetLive(s.l); err != nil { // validated: cannot fail
				g.log.Error("forward settings not reloaded", "log", s.f.Name(), "error", err)
			}
		}
	}, nil
}

// adopts reports whether fc sends forward log name of a former entry.
func adopts(fc config.Forward, name string) bool {
	return slices.Contains(fc.Adopt, forward.LogUpstream(name))
}

// DroppedLog is what DropFormerLogs deleted of one forward log.
type DroppedLog struct {
	Log                   string
	Messages, DeadLetters int
}

// DropFormerLogs deletes, for good, the messages and dead letters of
// every forward log of former (a forward: entry renamed or removed) in
// the data file of dataDir, whose gateway must be stopped, and returns
// what it deleted per log (none: former has no log holding anything).
func DropFormerLogs(dataDir, former string) ([]DroppedLog, error) {
	st, err := persist.Open(dataDir, persist.Options{})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	logs, err := st.HeldLogs()
	if err != nil {
		return nil, err
	}
	var out []DroppedLog
	for _, name := range logs {
		if forward.LogUpstream(name) != former {
			continue
		}
		n, err := st.DropForward(name)
		if err != nil {
			return out, err
		}
		d, err := st.DropDeadLog(name)
		if err != nil {
			return out, err
		}
		out = append(out, DroppedLog{name, n, d})
	}
	return out, nil
}

// stranded refuses a start that would leave a forward log holding
// messages or dead letters with no entry to send or show them (an
// entry renamed or removed, or forward: removed or emptied): it names
// each log and its counts, and what to do.
func stranded(cfg config.Config, store *persist.Store, logs []string) error {
	var lost []string
	first := ""
	for _, name := range logs {
		owned := false
		for _, fc := range cfg.Forward {
			if forward.LogUpstream(name) == fc.Name || adopts(fc, name) {
				owned = true
			}
		}
		if owned {
			continue
		}
		n, _, _, _, err := store.ForwardStats(name)
		if err != nil {
			return err
		}
		dead, err := store.DeadCount(name)
		if err != nil {
			return err
		}
		if first == "" {
			first = forward.LogUpstream(name)
		}
		held := fmt.Sprintf("%d messages", n)
		if dead > 0 {
			held += fmt.Sprintf(" and %d dead letters", dead)
		}
		lost = append(lost, fmt.Sprintf("forward log %q holds %s of %q, which is no entry of forward:", name, held, forward.LogUpstream(name)))
	}
	if lost == nil {
		return nil
	}
	old := first
	return &actionError{fmt.Sprintf("%s; send them through another entry (adopt: [%q] in it) or drop them (gateway forward drop-log %s --data-dir %s, with the gateway stopped), then start again",
		strings.Join(lost, "; "), old, old, cfg.DataDir), errors.New("forward logs stranded")}
}

// dialers returns how to dial connection n of fc (suffixed: its MQTT
// client ID gets "-N"), its secrets and TLS files read; the error names
// the key.
func dialers(fc config.Forward, host string, deliver func(topic string, payload []byte, retain bool, qos byte) error, log *slog.Logger) (func(n int, suffixed bool) forward.Dialer, error) {
	password, err := fc.Secret(os.Getenv, os.ReadFile)
	if err != nil {
		return nil, err
	}
	var tlsConf *tls.Config
	if fc.Secure() {
		if tlsConf, err = auth.ClientTLS(fc.TLS.CAFile, fc.TLS.CertFile, fc.TLS.KeyFile, fc.TLS.ServerName); err != nil {
			return nil, fmt.Errorf("tls.%w", err)
		}
	}
	var one forward.Dialer // the same for every connection
	switch fc.Kind() {
	case "redis":
		one = &redisstream.Dialer{Options: &redis.Options{Addr: fc.Addr(), DB: fc.RedisDB(), Username: fc.Username, Password: password, TLSConfig: tlsConf},
			Stream: fc.Stream, MaxLen: int64(fc.MaxLen)}
	case "nats":
		d := &natsjs.Dialer{URLs: "nats://" + strings.Join(fc.Hosts(), ",nats://"), Subject: fc.Subject}
		if tlsConf != nil {
			d.Options = append(d.Options, nats.Secure(tlsConf))
		}
		if fc.CredsFile != "" {
			d.Options = append(d.Options, nats.UserCredentials(fc.CredsFile))
		}
		if fc.Username != "" {
			d.Options = append(d.Options, nats.UserInfo(fc.Username, password))
		}
		one = d
	case "kafka":
		d := &kafka.Dialer{Seeds: fc.Hosts(), Topic: fc.KafkaTopic}
		if tlsConf != nil {
			d.Options = append(d.Options, kgo.DialTLSConfig(tlsConf))
		}
		switch fc.SASL {
		case "PLAIN":
			d.Options = append(d.Options, kgo.SASL(plain.Auth{User: fc.Username, Pass: password}.AsMechanism()))
		case "SCRAM-SHA-256":
			d.Options = append(d.Options, kgo.SASL(scram.Auth{User: fc.Username, Pass: password}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			d.Options = append(d.Options, kgo.SASL(scram.Auth{User: fc.Username, Pass: password}.AsSha512Mechanism()))
		}
		one = d
	}
	if one != nil {
		return func(int, bool) forward.Dialer { return one }, nil
	}
	d := &forward.MQTT{Address: fc.Addr(), V5: fc.MQTTVersion == "5", ClientID: fc.ClientID, Username: fc.Username, Password: password,
		KeepAlive: time.Duration(fc.KeepAlive), Persistent: fc.PersistentSession,
		Subscribe: fc.Subscribe, Map: forward.Map{Local: fc.LocalPrefix, Remote: fc.RemotePrefix}, Deliver: deliver,
		OnDeliverError: func(topic string, err error) {
			log.Error("command from upstream not kept; not acknowledged, the connection ends", "upstream", fc.Name, "topic", topic, "error", err)
		}}
	if d.ClientID == "" {
		d.ClientID = "devicegate-" + host + "-" + fc.Name
	}
	d.TLS = tlsConf
	return func(n int, suffixed bool) forward.Dialer {
		c := *d
		if suffixed {
			c.ClientID += "-" + strconv.Itoa(n)
		}
		return &c
	}, nil
}

// forwarder is the broker's Forwarder: the set, or nil without one (a
// nil *forward.Set in the interface would not be nil).
func (g *Gateway) forwarder() broker.Forwarder {
	if g.forward == nil {
		return nil
	}
	return g.forward
}

// forwardStats converts the upstreams' states for the metrics.
func forwardStats(s *forward.Set) []admin.ForwardStats {
	if s == nil {
		return nil
	}
	var out []admin.ForwardStats
	for _, st := range s.Stats() {
		out = append(out, admin.ForwardStats(st))
	}
	return out
}

// overflow is the forward package's overflow policy of a configuration
// name (validated): drop_oldest when empty.
func overflow(name string) forward.Overflow {
	if name == "refuse_new" {
		return forward.RefuseNew
	}
	return forward.DropOldest
}

// deadLetters is the admin API's view of the upstreams' dead letters
// (every connection's log of an upstream together).
type deadLetters struct{ s *forward.Set }

func (d deadLetters) upstream(name string) ([]*forward.Forwarder, error) {
	if d.s == nil {
		return nil, admin.ErrNoUpstream
	}
	fs := d.s.Upstream(name)
	if fs == nil {
		return nil, admin.ErrNoUpstream
	}
	return fs, nil
}

func (d deadLetters) DeadLetters(name string, limit int) (int, []admin.DeadLetter, error) {
	fs, err := d.upstream(name)
	if err != nil {
		return 0, nil, err
	}
	total := 0
	var out []admin.DeadLetter
	for _, f := range fs {
		list, n, err := f.DeadLetters(limit - len(out))
		if err != nil {
			return 0, nil, err
		}
		total += n
		for _, dl := range list {
			out = append(out, admin.DeadLetter{Log: f.Name(), Seq: dl.Seq, ID: dl.ID, At: dl.At, Reason: dl.Reason, Error: dl.Error,
				Device: dl.Message.Device, Topic: dl.Message.Topic, Payload: len(dl.Message.Payload), Damaged: dl.Damaged})
		}
	}
	return total, out, nil
}

func (d deadLetters) ReplayDead(name string, ids []string) (int, error) {
	return d.each(name, ids, forward.ReplayDeadOf)
}
func (d deadLetters) DropDead(name string, ids []string) (int, error) {
	return d.each(name, ids, forward.DropDeadOf)
}

// each runs op on the forwarders of upstream name, which checks the IDs
// and acts in one go: an ID none holds is an error before anything is
// done.
func (d deadLetters) each(name string, ids []string, op func([]*forward.Forwarder, []string) (int, error)) (int, error) {
	fs, err := d.upstream(name)
	if err != nil {
		return 0, err
	}
	n, err := op(fs, ids)
	if none, ok := errors.AsType[*forward.NoDeadError](err); ok {
		return 0, &admin.NoDeadError{IDs: none.IDs}
	}
	return n, err
}
