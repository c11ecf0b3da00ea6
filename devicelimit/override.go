package devicelimit

// Quota overrides: set at runtime per device (or group key), kept in
// the resolver's shards, expiring by themselves.

import (
	"fmt"
	"sort"
	"sync"
)

// Override is a runtime quota for one device, in force until ExpiresAt
// (never when zero). Classes, when there are any, are the device's
// topic classes instead of its rule's (or the default's); an override
// without classes keeps those.
type Override struct {
	Quota     Quota
	ExpiresAt Tick
	Classes   []Class
}

// Validate reports whether o can be set for device on a table of the
// given bucket count: a valid device ID, a valid quota, and an expiry not
// before 1970 (0: none). It is the one check of an override, made by the
// resolver, the store, the Redis overrides and the admin API alike; the
// error is a *FieldError naming the field.
func (o Override) Validate(device string, buckets int) error {
	if err := ValidOverrideKey(device); err != nil {
		return err
	}
	if err := o.Quota.Validate(buckets); err != nil {
		return err
	}
	if err := ValidateClasses(o.Classes, buckets); err != nil {
		return err
	}
	if o.ExpiresAt < 0 {
		return &FieldError{Field: "expires_at", Msg: fmt.Sprintf("must not be before 1970 (got %d ns)", int64(o.ExpiresAt)), Err: ErrInvalidQuota}
	}
	return nil
}

// Expired reports whether the override has lapsed at now.
func (o Override) Expired(now Tick) bool { return o.ExpiresAt != 0 && now >= o.ExpiresAt }

const overrideShards = 64

type overrideShard struct {
	mu sync.RWMutex
	m  map[string]Override
	_  [40]byte // keep shards on separate cache lines
}

func (r *Resolver) shard(device string) *overrideShard {
	return &r.shards[hashString(device)%overrideShards]
}

// Override returns the device's override in force at now. An expired
// override is reported absent (and removed by Prune).
func (r *Resolver) Override(device string, now Tick) (Override, bool) {
	if r.count.Load() == 0 {
		return Override{}, false
	}
	s := r.shard(device)
	s.mu.RLock()
	o, ok := s.m[device]
	s.mu.RUnlock()
	if !ok || o.Expired(now) {
		return Override{}, false
	}
	return o, true
}

// SetOverride sets the device's override after validating it; an invalid
// one changes nothing.
func (r *Resolver) SetOverride(device string, o Override) error {
	if err := o.Validate(device, r.buckets); err != nil {
		return err
	}
	if blocks(o.Quota, o.Classes) {
		r.blocking.Store(true)
	}
	s := r.shard(device)
	s.mu.Lock()
	if _, ok := s.m[device]; !ok {
		r.count.Add(1)
	}
	s.m[device] = o
	s.mu.Unlock()
	r.gen.Add(1)
	return nil
}

// DeleteOverride removes the device's override and reports whether it
// had one.
func (r *Resolver) DeleteOverride(device string) bool {
	s := r.shard(device)
	s.mu.Lock()
	_, ok := s.m[device]
	if ok {
		delete(s.m, device)
		r.count.Add(-1)
		r.gen.Add(1)
	}
	s.mu.Unlock()
	return ok
}

// DeviceOverride is one entry of Overrides.
type DeviceOverride struct {
	Device string
	Override
}

// Overrides returns the overrides in force at now, sorted by device.
func (r *Resolver) Overrides(now Tick) []DeviceOverride {
	var out []DeviceOverride
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.RLock()
		for d, o := range s.m {
			if !o.Expired(now) {
				out = append(out, DeviceOverride{Device: d, Override: o})
			}
		}
		s.mu.RUnlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
}

// Prune removes the overrides expired at now and returns their devices.
func (r *Resolver) Prune(now Tick) []string {
	var gone []string
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for d, o := range s.m {
			if o.Expired(now) {
				delete(s.m, d)
				r.count.Add(-1)
				r.gen.Add(1)
				gone = append(gone, d)
			}
		}
		s.mu.Unlock()
	}
	sort.Strings(gone)
	return gone
}
