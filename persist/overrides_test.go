package persist

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

func TestSetOverrideIsDurableOnReturn(t *testing.T) {
	s := open(t, t.TempDir())
	r := newResolver(t, 10)
	o := devicelimit.Override{Quota: devicelimit.Quota{Limit: 7, Window: 2 * time.Second, Policy: devicelimit.PolicyDefer}, ExpiresAt: t0.Add(time.Hour)}
	if err := s.SetOverride(r, "dev", o); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Override("dev", t0); !ok || !reflect.DeepEqual(got, o) {
		t.Fatalf("resolver has %+v, %v; want %+v", got, ok, o)
	}
	// The store is still open: a copy of its file is what a crash now
	// would leave behind.
	s2 := open(t, copyStore(t, s))
	r2 := newResolver(t, 10)
	if n, err := s2.RestoreOverrides(r2, t0); err != nil || n != 1 {
		t.Fatalf("restored %d overrides (%v), want 1", n, err)
	}
	if got, ok := r2.Override("dev", t0); !ok || !reflect.DeepEqual(got, o) {
		t.Fatalf("restored %+v, %v; want %+v", got, ok, o)
	}

	had, err := s.DeleteOverride(r, "dev")
	if err != nil || !had {
		t.Fatalf("delete: %v, %v; want true", had, err)
	}
	if _, ok := r.Override("dev", t0); ok {
		t.Fatal("resolver kept the deleted override")
	}
	s3 := open(t, copyStore(t, s))
	if n, err := s3.RestoreOverrides(newResolver(t, 10), t0); err != nil || n != 0 {
		t.Fatalf("after delete: restored %d overrides (%v), want 0", n, err)
	}
	if had, err := s.DeleteOverride(r, "dev"); err != nil || had {
		t.Fatalf("second delete: %v, %v; want false", had, err)
	}
}

func TestSetOverrideInvalidChangesNothing(t *testing.T) {
	s := open(t, t.TempDir())
	r := newResolver(t, 10)
	good := devicelimit.Override{Quota: q}
	if err := s.SetOverride(r, "dev", good); err != nil {
		t.Fatal(err)
	}
	before := fileBytes(t, s.Path())
	for name, c := range map[string]struct {
		device string
		o      devicelimit.Override
		want   error
	}{
		"zero limit":         {"dev", devicelimit.Override{Quota: devicelimit.Quota{Window: time.Second}}, devicelimit.ErrInvalidQuota},
		"window too short":   {"dev", devicelimit.Override{Quota: devicelimit.Quota{Limit: 1, Window: 5 * ms}}, devicelimit.ErrInvalidQuota},
		"unknown policy":     {"dev", devicelimit.Override{Quota: devicelimit.Quota{Limit: 1, Window: time.Second, Policy: 9}}, devicelimit.ErrInvalidPolicy},
		"negative expiry":    {"dev", devicelimit.Override{Quota: q, ExpiresAt: -1}, devicelimit.ErrInvalidQuota},
		"empty device":       {"", good, devicelimit.ErrInvalidDevice},
		"device over MQTT's": {strings.Repeat("x", devicelimit.MaxDeviceID+1), good, devicelimit.ErrInvalidDevice},
	} {
		err := s.SetOverride(r, c.device, c.o)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: got %v, want %v", name, err, c.want)
		}
	}
	if got, ok := r.Override("dev", t0); !ok || !reflect.DeepEqual(got, good) {
		t.Fatalf("resolver has %+v, %v; want %+v", got, ok, good)
	}
	if len(r.Overrides(t0)) != 1 {
		t.Fatalf("resolver overrides %+v", r.Overrides(t0))
	}
	if string(fileBytes(t, s.Path())) != string(before) {
		t.Fatal("a refused override changed the file")
	}
}

func TestRestoreOverrides(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := newResolver(t, 10)
	set := map[string]devicelimit.Override{
		"forever":   {Quota: q},
		"later":     {Quota: q, ExpiresAt: t0.Add(time.Hour)},
		"expired":   {Quota: q, ExpiresAt: t0.Add(time.Minute)},
		"just-now":  {Quota: q, ExpiresAt: t0.Add(2 * time.Minute)},
		"fine-only": {Quota: devicelimit.Quota{Limit: 3, Window: 10 * ms}}, // 10 buckets of 1 ms
	}
	for d, o := range set {
		if err := s.SetOverride(r, d, o); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	// Restart with 20 buckets at t0+2m: two have expired, one no longer
	// validates (10 ms cannot be cut in 20 buckets of 1 ms).
	var logs logBuffer
	s, err := Open(dir, Options{Logger: newLogger(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	r2 := newResolver(t, 20)
	now := t0.Add(2 * time.Minute)
	n, err := s.RestoreOverrides(r2, now)
	if err != nil || n != 2 {
		t.Fatalf("restored %d (%v), want 2", n, err)
	}
	got := r2.Overrides(now)
	if len(got) != 2 || got[0].Device != "forever" || got[1].Device != "later" || !reflect.DeepEqual(got[1].Override, set["later"]) {
		t.Fatalf("restored %+v", got)
	}
	if logs.count("level=WARN", "device=fine-only", "stored quota override not applied") != 1 {
		t.Fatalf("want one warning naming fine-only, got:\n%s", logs.String())
	}
	s.Close()

	// The expired ones were deleted; the one that did not validate was
	// kept, and comes back with 10 buckets.
	s = open(t, dir)
	r3 := newResolver(t, 10)
	if n, err := s.RestoreOverrides(r3, t0); err != nil || n != 3 {
		t.Fatalf("after restart with 10 buckets: restored %d (%v), want 3 (forever, later, fine-only)", n, err)
	}
	if _, ok := r3.Override("fine-only", t0); !ok {
		t.Fatal("fine-only was dropped")
	}
}

func TestRestoreOverridesBadRecord(t *testing.T) {
	s := open(t, t.TempDir())
	err := s.update(func(tx *boltTx) error {
		return tx.Bucket(bucketOverrides).Put([]byte("broken"), []byte{1, 0})
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.RestoreOverrides(newResolver(t, 10), t0)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), s.Path()) || !strings.Contains(err.Error(), `"broken"`) {
		t.Fatalf("got %v, want ErrCorrupt naming the file and device", err)
	}
}
