package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/devicelimit"
)

// GroupRegistry shares among the gateways of a cluster which groups
// their devices joined: one hash, PREFIX "groups", whose field is a
// group's name and whose value is its label and its rule's quota
// (devicelimit.MarshalMembership). A gateway records a group the first
// time one of its devices joins it, so that every gateway's admin API
// knows the groups whose devices are on others (their windows are
// shared already). The latest record of a group wins: after a
// configuration change, the first gateway whose device joins records
// the new quota. Entries stay (groups are an operator's tenants, few;
// HDEL removes one).
type GroupRegistry struct {
	rdb     redis.UniversalClient
	key     string
	buckets int
	log     *slog.Logger

	mu     sync.RWMutex // Record's sends against Close's close
	closed bool
	queue  chan devicelimit.Membership
	wg     sync.WaitGroup
}

// registryQueue bounds the groups waiting to be recorded.
const registryQueue = 1024

// NewGroupRegistry shares groups in rdb under prefix (the Limiter's),
// reading quotas for a table of buckets buckets, and starts recording.
func NewGroupRegistry(rdb redis.UniversalClient, prefix string, buckets int, log *slog.Logger) *GroupRegistry {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &GroupRegistry{rdb: rdb, key: prefix + "groups", buckets: buckets, log: log, queue: make(chan devicelimit.Membership, registryQueue)}
	r.wg.Add(1)
	go r.run()
	return r
}

// Record queues m to be recorded; it never waits (it runs as a device
// connects). A group that finds the queue full is logged and left out.
func (r *GroupRegistry) Record(m devicelimit.Membership) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return
	}
	select {
	case r.queue <- m:
	default:
		r.log.Warn("group not shared in redis: too many waiting", "group", m.Name)
	}
}

func (r *GroupRegistry) run() {
	defer r.wg.Done()
	for m := range r.queue {
		ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
		err := r.rdb.HSet(ctx, r.key, m.Name, devicelimit.MarshalMembership(m)).Err()
		cancel()
		if err != nil {
			r.log.Warn("group not shared in redis; other gateways list it once another of its devices connects", "group", m.Name, "err", err.Error())
		}
	}
}

// List returns the groups recorded, by name. A record this version
// cannot read is logged and left out.
func (r *GroupRegistry) List(ctx context.Context) ([]devicelimit.Membership, error) {
	all, err := r.rdb.HGetAll(ctx, r.key).Result()
	if err != nil {
		return nil, fmt.Errorf("read the shared groups from redis: %w", err)
	}
	out := make([]devicelimit.Membership, 0, len(all))
	for name, v := range all {
		m, err := devicelimit.UnmarshalMembership(name, []byte(v), r.buckets)
		if err != nil {
			r.log.Warn("shared group record not understood; left out", "group", name, "err", err.Error())
			continue
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Close records what is queued and stops.
func (r *GroupRegistry) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	r.wg.Wait()
}
