package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The settings every gateway sharing a Redis must agree on: where
// device publishes are decided (cluster.decisions). A gateway deciding
// in Redis and one deciding where the device is keep two windows for a
// device that moves between them, so it could be admitted up to twice
// its quota. (Bucket counts may differ: a window cut into other buckets
// is converted conservatively, devicelimit's Table.Restore and the
// script's expiry. Lease shares and gateway TTLs are each gateway's
// own.)
//
// They live in the hash <prefix>settings, which every gateway renews
// (SettingsTTL) while it runs: a gateway whose settings differ from the
// hash's is refused at start, and one that finds them differing later
// (the hash expired during an outage and another gateway wrote its
// own) logs it as an error at every renewal. To change them, stop every
// gateway and wait SettingsTTL.

// SettingsTTL is how long the shared settings outlive the last renewal
// of the last gateway.
const SettingsTTL = 30 * time.Second

// settingsScript compares ARGV[1] with the hash's decisions: when they
// differ it returns the hash's; else it writes them, renews the hash
// for ARGV[2] ms and returns "".
var settingsScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'decisions')
if cur and cur ~= ARGV[1] then return cur end
redis.call('HSET', KEYS[1], 'decisions', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return ''
`)

// SettingsError is a gateway's settings differing from those of the
// gateways already sharing the Redis.
type SettingsError struct {
	Key         string // the config key
	Here, There string // this gateway's value, the others'
	RedisKey    string
}

func (e *SettingsError) Error() string {
	return fmt.Sprintf("%s: %q here, but the gateways sharing this redis run with %q (redis key %s, kept while any of them runs and for %s after): "+
		"a device moving between the two would be decided on two windows, up to twice its quota; give every gateway the same %s (to change it, stop them all and wait %s)",
		e.Key, e.Here, e.There, e.RedisKey, SettingsTTL, e.Key, SettingsTTL)
}

// Settings keeps a gateway's shared settings agreed in Redis: Agree
// checks them at start, then renews them until Close.
type Settings struct {
	rdb       redis.UniversalClient
	key       string
	decisions string
	ttl       time.Duration
	timeout   time.Duration
	log       *slog.Logger

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// Agree checks decisions (cluster.decisions) against the gateways
// sharing rdb under prefix (DefaultPrefix when "") and starts renewing
// them. A *SettingsError when they differ; when Redis does not answer
// within timeout it logs that the check waits and goes on: the renewals
// check again, and log a difference they find. Close stops it.
func Agree(rdb redis.UniversalClient, prefix, decisions string, timeout time.Duration, log *slog.Logger) (*Settings, error) {
	return agree(rdb, prefix, decisions, timeout, SettingsTTL, log)
}

// agree is Agree with the settings kept for ttl.
func agree(rdb redis.UniversalClient, prefix, decisions string, timeout, ttl time.Duration, log *slog.Logger) (*Settings, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Settings{rdb: rdb, key: prefix + "settings", decisions: decisions, ttl: ttl, timeout: timeout, log: log,
		stop: make(chan struct{}), done: make(chan struct{})}
	err := s.check()
	var se *SettingsError
	if errors.As(err, &se) {
		return nil, err
	}
	if err != nil {
		log.Warn("cluster settings not yet compared with the other gateways'; redis did not answer, the next renewal compares them", "err", err.Error())
	}
	go s.renew()
	return s, nil
}

// check compares and renews once.
func (s *Settings) check() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	there, err := settingsScript.Run(ctx, s.rdb, []string{s.key}, s.decisions, s.ttl.Milliseconds()).Text()
	if err != nil {
		return err
	}
	if there != "" {
		return &SettingsError{Key: "cluster.decisions", Here: s.decisions, There: there, RedisKey: s.key}
	}
	return nil
}

// renew checks and renews every third of the TTL until Close.
func (s *Settings) renew() {
	defer close(s.done)
	t := time.NewTicker(s.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		err := s.check()
		var se *SettingsError
		switch {
		case errors.As(err, &se):
			s.log.Error("gateways sharing this redis disagree on their settings", "err", err.Error())
		case err != nil:
			s.log.Debug("cluster settings not renewed", "err", err.Error())
		}
	}
}

// Close stops the renewals (the settings expire SettingsTTL after the
// last gateway's).
func (s *Settings) Close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}
