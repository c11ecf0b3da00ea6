package persist

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/devicelimit"
)

// SetOverride validates o for device against r's bucket count, writes it
// durably (committed and fsynced), then sets it in r. An invalid override
// or a failed write changes nothing, neither in the store nor in r.
func (s *Store) SetOverride(r *devicelimit.Resolver, device string, o devicelimit.Override) error {
	if err := o.Validate(device, r.Buckets()); err != nil {
		return fmt.Errorf("set override for %s: %w", keyName([]byte(device)), err)
	}
	s.overrideMu.Lock()
	defer s.overrideMu.Unlock()
	err := s.update(func(tx *bolt.Tx) error {
		if longID(device) {
			b, err := longBucket(tx, bucketOverridesLong, true)
			if err != nil {
				return err
			}
			return b.Put(longKey(device), appendOverride(appendLongValue(nil, device, nil), o))
		}
		return tx.Bucket(bucketOverrides).Put([]byte(device), appendOverride(nil, o))
	})
	if err != nil {
		return fmt.Errorf("set override for %s in %q: %w", keyName([]byte(device)), s.path, err)
	}
	// Validated above with the resolver's own check: cannot fail.
	if err := r.SetOverride(device, o); err != nil {
		return fmt.Errorf("set override for %s: stored but not applied: %w", keyName([]byte(device)), err)
	}
	return nil
}

// DeleteOverride removes device's override durably, then from r, and
// reports whether either held one.
func (s *Store) DeleteOverride(r *devicelimit.Resolver, device string) (bool, error) {
	if err := devicelimit.ValidOverrideKey(device); err != nil {
		return false, fmt.Errorf("delete override: %w", err)
	}
	s.overrideMu.Lock()
	defer s.overrideMu.Unlock()
	stored := false
	err := s.update(func(tx *bolt.Tx) error {
		b, key := tx.Bucket(bucketOverrides), []byte(device)
		if longID(device) {
			b, key = tx.Bucket(bucketOverridesLong), longKey(device)
		}
		if b == nil || b.Get(key) == nil {
			return nil
		}
		stored = true
		return b.Delete(key)
	})
	if err != nil {
		return false, fmt.Errorf("delete override for %s in %q: %w", keyName([]byte(device)), s.path, err)
	}
	return r.DeleteOverride(device) || stored, nil
}

// RestoreOverrides loads the stored overrides into r and returns how
// many it set. Overrides expired at now are deleted from the store
// instead. An override that no longer validates for r's bucket count
// (the configuration changed) is logged at Warn and skipped, but kept in
// the store: changing the buckets back restores it, and SetOverride or
// DeleteOverride replace it. Overrides of device IDs too long to be keys
// are read from their own bucket (see longKey) like the others. A record that does not decode stops the
// restore with an error wrapping ErrCorrupt naming the file and device.
func (s *Store) RestoreOverrides(r *devicelimit.Resolver, now devicelimit.Tick) (int, error) {
	s.overrideMu.Lock()
	defer s.overrideMu.Unlock()
	n := 0
	var expired, expiredLong [][]byte
	// restore applies the override stored as v for device under key.
	restore := func(key, device, v []byte, long bool) error {
		o, err := decodeOverride(v)
		if err != nil {
			return fmt.Errorf("device %s: %w", keyName(device), err)
		}
		if o.Expired(now) {
			k := append([]byte(nil), key...)
			if long {
				expiredLong = append(expiredLong, k)
			} else {
				expired = append(expired, k)
			}
			return nil
		}
		id := string(device)
		if err := o.Quota.Validate(r.Buckets()); err != nil {
			s.log.Warn("stored quota override not applied", "device", id, "quota", o.Quota.String(), "reason", err)
			return nil
		}
		if err := r.SetOverride(id, o); err != nil {
			s.log.Warn("stored quota override not applied", "device", id, "quota", o.Quota.String(), "reason", err)
			return nil
		}
		n++
		return nil
	}
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketOverrides).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if err := restore(k, k, v, false); err != nil {
				return err
			}
		}
		long := tx.Bucket(bucketOverridesLong)
		if long == nil {
			return nil
		}
		c = long.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			device, enc, err := decodeLongValue(k, v)
			if err != nil {
				return err
			}
			if err := restore(k, device, enc, true); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("restore overrides from %q: %w", s.path, err)
	}
	if len(expired)+len(expiredLong) == 0 {
		return n, nil
	}
	err = s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketOverrides)
		for _, k := range expired {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		if len(expiredLong) == 0 {
			return nil
		}
		b = tx.Bucket(bucketOverridesLong)
		for _, k := range expiredLong {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("delete expired overrides from %q: %w", s.path, err)
	}
	return n, nil
}

// BoundOverrides is the store's write-through overrides bound to one
// resolver: the methods the admin API calls to set and delete them.
type BoundOverrides struct {
	Store    *Store
	Resolver *devicelimit.Resolver
}

// SetOverride is Store.SetOverride on the bound resolver.
func (o BoundOverrides) SetOverride(device string, ov devicelimit.Override) error {
	return o.Store.SetOverride(o.Resolver, device, ov)
}

// DeleteOverride is Store.DeleteOverride on the bound resolver.
func (o BoundOverrides) DeleteOverride(device string) (bool, error) {
	return o.Store.DeleteOverride(o.Resolver, device)
}
