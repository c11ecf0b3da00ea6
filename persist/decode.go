package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/varint"
)

// The decoders read bytes from the data file, which may be damaged or
// written by another version: they never panic, reject anything but the
// one canonical encoding, and wrap ErrCorrupt (or ErrNewerSchema).

// decodeMeta decodes the meta bucket's values (nil when a key is absent)
// of a store that is not new. The schema version must be present; an
// absent clock reads 0 and an absent clean flag false.
func decodeMeta(schema, clock, clean []byte) (Meta, error) {
	var m Meta
	if len(schema) == 0 {
		return Meta{}, fmt.Errorf("%w: no schema version in meta", ErrCorrupt)
	}
	v, n := varint.Uvarint(schema)
	switch {
	case n <= 0 || n != len(schema):
		return Meta{}, fmt.Errorf("%w: malformed schema version % x", ErrCorrupt, schema)
	case v == 0:
		return Meta{}, fmt.Errorf("%w: schema version 0", ErrCorrupt)
	case v > SchemaVersion:
		return Meta{}, fmt.Errorf("%w: schema version %d, this gateway reads up to %d", ErrNewerSchema, v, SchemaVersion)
	}
	m.Schema = int(v)
	if clock != nil {
		if len(clock) != 8 {
			return Meta{}, fmt.Errorf("%w: meta clock is %d bytes, want 8", ErrCorrupt, len(clock))
		}
		hw := int64(binary.BigEndian.Uint64(clock))
		if hw < 0 {
			return Meta{}, fmt.Errorf("%w: negative clock high-water %d", ErrCorrupt, hw)
		}
		m.HighWater = devicelimit.Tick(hw)
	}
	if clean != nil {
		if len(clean) != 1 || clean[0] > 1 {
			return Meta{}, fmt.Errorf("%w: meta clean flag is % x, want 00 or 01", ErrCorrupt, clean)
		}
		m.CleanShutdown = clean[0] == 1
	}
	return m, nil
}

// decodeOverride decodes an override encoded by appendOverride. It checks
// the ranges any quota must meet; whether the quota suits the resolver's
// bucket count is the caller's check (Quota.Validate).
func decodeOverride(b []byte) (devicelimit.Override, error) {
	if len(b) == 0 {
		return devicelimit.Override{}, fmt.Errorf("%w: empty override", ErrCorrupt)
	}
	switch b[0] {
	case overrideWindows:
		return decodeOverrideWindows(b[1:])
	case overrideClasses:
		o, err := devicelimit.UnmarshalOverride(b[1:])
		if err == nil {
			err = o.Validate("device", 1) // the ranges; the buckets are the caller's check
		}
		if err == nil && !o.NeedsJSON() {
			err = errors.New("neither classes nor shadow mode")
		}
		if err == nil && !bytes.Equal(devicelimit.MarshalOverride(o), b[1:]) {
			err = errors.New("not in the form the gateway writes") // one record, one encoding
		}
		if err != nil {
			return devicelimit.Override{}, fmt.Errorf("%w: override with topic classes: %v", ErrCorrupt, err)
		}
		return o, nil
	case overrideVersion:
	default:
		return devicelimit.Override{}, fmt.Errorf("%w: override version %d, want %d, %d or %d", ErrCorrupt, b[0], overrideVersion, overrideWindows, overrideClasses)
	}
	b = b[1:]
	limit, n := varint.Uvarint(b)
	if n <= 0 {
		return devicelimit.Override{}, fmt.Errorf("%w: truncated or malformed override limit", ErrCorrupt)
	}
	b = b[n:]
	if limit < 1 || limit > devicelimit.MaxLimit {
		return devicelimit.Override{}, fmt.Errorf("%w: override limit %d out of range", ErrCorrupt, limit)
	}
	window, n := varint.Uvarint(b)
	if n <= 0 {
		return devicelimit.Override{}, fmt.Errorf("%w: truncated or malformed override window", ErrCorrupt)
	}
	b = b[n:]
	if window < 1 || window > uint64(devicelimit.MaxWindow) {
		return devicelimit.Override{}, fmt.Errorf("%w: override window %d ns out of range", ErrCorrupt, window)
	}
	if len(b) == 0 {
		return devicelimit.Override{}, fmt.Errorf("%w: truncated override policy", ErrCorrupt)
	}
	policy := devicelimit.Policy(b[0])
	if _, err := policy.MarshalText(); err != nil {
		return devicelimit.Override{}, fmt.Errorf("%w: override %w", ErrCorrupt, err)
	}
	b = b[1:]
	expires, n := varint.Varint(b)
	if n <= 0 {
		return devicelimit.Override{}, fmt.Errorf("%w: truncated or malformed override expiry", ErrCorrupt)
	}
	b = b[n:]
	if expires < 0 {
		return devicelimit.Override{}, fmt.Errorf("%w: negative override expiry %d", ErrCorrupt, expires)
	}
	if len(b) != 0 {
		return devicelimit.Override{}, fmt.Errorf("%w: %d trailing bytes after override", ErrCorrupt, len(b))
	}
	return devicelimit.Override{
		Quota:     devicelimit.Quota{Limit: int(limit), Window: time.Duration(window), Policy: policy},
		ExpiresAt: devicelimit.Tick(expires),
	}, nil
}

// decodeOverrideWindows decodes the rest of a version 2 override (see
// appendOverride), checking every field.
func decodeOverrideWindows(b []byte) (devicelimit.Override, error) {
	bad := func(what string) (devicelimit.Override, error) {
		return devicelimit.Override{}, fmt.Errorf("%w: override of several windows: %s", ErrCorrupt, what)
	}
	if len(b) == 0 {
		return bad("truncated policy")
	}
	policy := devicelimit.Policy(b[0])
	if _, err := policy.MarshalText(); err != nil {
		return bad(err.Error())
	}
	expires, n := varint.Varint(b[1:])
	if n <= 0 || expires < 0 {
		return bad("truncated, malformed or negative expiry")
	}
	b = b[1+n:]
	if len(b) == 0 || b[0] < 1 || b[0] > devicelimit.MaxWindows {
		return bad("no count of windows, or one out of 1 to 4")
	}
	ls := make([]devicelimit.Limit, b[0])
	b = b[1:]
	for i := range ls {
		if len(b) == 0 || b[0] > byte(devicelimit.Bytes) {
			return bad(fmt.Sprintf("window %d: truncated or unknown unit", i))
		}
		ls[i].Unit = devicelimit.Unit(b[0])
		limit, n := varint.Uvarint(b[1:])
		if n <= 0 || limit > devicelimit.MaxBytes {
			return bad(fmt.Sprintf("window %d: truncated or malformed limit", i))
		}
		b = b[1+n:]
		window, n := varint.Uvarint(b)
		if n <= 0 || window > uint64(devicelimit.MaxWindow) {
			return bad(fmt.Sprintf("window %d: truncated or malformed length", i))
		}
		b = b[n:]
		ls[i].N, ls[i].Window = int(limit), time.Duration(window)
	}
	if len(b) != 0 {
		return bad(fmt.Sprintf("%d trailing bytes", len(b)))
	}
	// The ranges of each window: those of a quota of the largest bucket
	// width (one bucket); the store checks against its own count later.
	if err := devicelimit.ValidateLimits(ls, 1); err != nil {
		return bad(err.Error())
	}
	return devicelimit.Override{Quota: devicelimit.WithWindows(policy, ls...), ExpiresAt: devicelimit.Tick(expires)}, nil
}
