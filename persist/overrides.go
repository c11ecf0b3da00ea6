package persist

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"devicegate/devicelimit"
)

// SetOverride validates o for device against r's bucket count, writes it
// durably (committed and fsynced), then sets it in r. An invalid override
// or a failed write changes nothing, neither in the store nor in r.
func (s *Store) SetOverride(r *devicelimit.Resolver, device string, o devicelimit.Override) error {
	if err := validOverride(r, device, o); err != nil {
		return fmt.Errorf("set override for %s: %w", keyName([]byte(device)), err)
	}
	s.overrideMu.Lock()
	defer s.overrideMu.Unlock()
	err := s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketOverrides).Put([]byte(device), appendOverride(nil, o))
	})
	if err != nil {
		return fmt.Errorf("set override for %s in %q: %w", keyName([]byte(device)), s.path, err)
	}
	// Validated above with the resolver's own checks: cannot fail.
	if err := r.SetOverride(device, o); err != nil {
		return fmt.Errorf("set override for %s: stored but not applied: %w", keyName([]byte(device)), err)
	}
	return nil
}

// validOverride makes the checks Resolver.SetOverride makes, and those of
// the store: the device ID must fit a bbolt key and the expiry must not
// be negative.
func validOverride(r *devicelimit.Resolver, device string, o devicelimit.Override) error {
	if err := devicelimit.ValidDeviceID(device); err != nil {
		return err
	}
	if len(device) > bolt.MaxKeySize {
		return fmt.Errorf("%w: %d bytes, the store keeps IDs of at most %d", devicelimit.ErrInvalidDevice, len(device), bolt.MaxKeySize)
	}
	if err := o.Quota.Validate(r.Buckets()); err != nil {
		return err
	}
	if o.ExpiresAt < 0 {
		return fmt.Errorf("%w: expiry %d is before 1970", devicelimit.ErrInvalidQuota, int64(o.ExpiresAt))
	}
	return nil
}

// DeleteOverride removes device's override durably, then from r, and
// reports whether either held one.
func (s *Store) DeleteOverride(r *devicelimit.Resolver, device string) (bool, error) {
	if err := devicelimit.ValidDeviceID(device); err != nil {
		return false, fmt.Errorf("delete override: %w", err)
	}
	s.overrideMu.Lock()
	defer s.overrideMu.Unlock()
	stored := false
	if len(device) <= bolt.MaxKeySize { // longer IDs are never stored
		err := s.update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketOverrides)
			key := []byte(device)
			if b.Get(key) == nil {
				return nil
			}
			stored = true
			return b.Delete(key)
		})
		if err != nil {
			return false, fmt.Errorf("delete override for %s in %q: %w", keyName([]byte(device)), s.path, err)
		}
	}
	return r.DeleteOverride(device) || stored, nil
}

// RestoreOverrides loads the stored overrides into r and returns how
// many it set. Overrides expired at now are deleted from the store
// instead. An override that no longer validates for r's bucket count
// (the configuration changed) is logged at Warn and skipped, but kept in
// the store: changing the buckets back restores it, and SetOverride or
// DeleteOverride replace it. A record that does not decode stops the
// restore with an error wrapping ErrCorrupt naming the file and device.
func (s *Store) RestoreOverrides(r *devicelimit.Resolver, now devicelimit.Tick) (int, error) {
	s.overrideMu.Lock()
	defer s.overrideMu.Unlock()
	n := 0
	var expired [][]byte
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketOverrides).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			o, err := decodeOverride(v)
			if err != nil {
				return fmt.Errorf("device %s: %w", keyName(k), err)
			}
			if o.Expired(now) {
				expired = append(expired, append([]byte(nil), k...))
				continue
			}
			device := string(k)
			if err := o.Quota.Validate(r.Buckets()); err != nil {
				s.log.Warn("stored quota override not applied", "device", device, "quota", o.Quota.String(), "reason", err)
				continue
			}
			if err := r.SetOverride(device, o); err != nil {
				s.log.Warn("stored quota override not applied", "device", device, "quota", o.Quota.String(), "reason", err)
				continue
			}
			n++
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("restore overrides from %q: %w", s.path, err)
	}
	if len(expired) == 0 {
		return n, nil
	}
	err = s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketOverrides)
		for _, k := range expired {
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
