package simulator

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseRatePolicies(t *testing.T) {
	// The wire brief's example, verbatim, and a shadow quota.
	got, err := ParseRatePolicies(`"10s";q=100;w=10, "24h";q=5000;w=86400, "10s-bytes";q=65536;w=10;qu="content-bytes", "telemetry/1m";q=30;w=60, "group/1m";q=1000;w=60`)
	if err != nil {
		t.Fatal(err)
	}
	want := []RatePolicy{
		{Name: "10s", Quota: 100, Window: 10 * time.Second},
		{Name: "24h", Quota: 5000, Window: 24 * time.Hour},
		{Name: "10s-bytes", Quota: 65536, Window: 10 * time.Second, Bytes: true},
		{Name: "telemetry/1m", Quota: 30, Window: time.Minute},
		{Name: "group/1m", Quota: 1000, Window: time.Minute},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	got, err = ParseRatePolicies(`"10s";q=100;w=10;shadow,"1h30m";q=7;w=5400;qu="requests";shadow;future=tok/en`)
	if err != nil {
		t.Fatal(err)
	}
	want = []RatePolicy{
		{Name: "10s", Quota: 100, Window: 10 * time.Second, Shadow: true},
		{Name: "1h30m", Quota: 7, Window: 90 * time.Minute, Shadow: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestParseRateRemaining(t *testing.T) {
	got, err := ParseRateRemaining(`"10s";r=42;t=7, "group/1m";r=900;t=31`)
	if err != nil {
		t.Fatal(err)
	}
	want := []RateRemaining{{Name: "10s", R: 42, T: 7 * time.Second}, {Name: "group/1m", R: 900, T: 31 * time.Second}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// Optional whitespace, a boolean written out, an escaped quote.
	got, err = ParseRateRemaining(`  "a\"b";r=0;t=3;shadow=?1 ,	"1m";r=5;t=0;shadow=?0  `)
	if err != nil {
		t.Fatal(err)
	}
	want = []RateRemaining{{Name: `a"b`, R: 0, T: 3 * time.Second, Shadow: true}, {Name: "1m", R: 5}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// Bad input is an error naming the field and what is wrong, never a
// partial list.
func TestParseRateBad(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		policy   bool
	}{
		{``, "empty list", false},
		{`"10s";r=1`, "want integers r >= 0 and t >= 0", false},
		{`"10s";r=-1;t=2`, "want integers r >= 0 and t >= 0", false},
		{`"10s";r=1.5;t=2`, "want an integer", false},
		{`"10s";r=1;t=2,`, "trailing comma", false},
		{`"10s";r=1;t=2 "1m"`, "want ',' between members", false},
		{`"10s;r=1`, "unterminated string", false},
		{`(1 2);r=1;t=2`, "want a string or a token", false},
		{`"10s";R=1;t=2`, "want a parameter key", false},
		{`"10s";r=1234567890123456;t=2`, "1 to 15 digits", false},
		{`"10s";q=1`, "want an integer q >= 0 and w > 0", true},
		{`"10s";q=1;w=0`, "want an integer q >= 0 and w > 0", true},
		{`"10s";q=1;w=10;qu="bits"`, `qu="bits"`, true},
	} {
		var err error
		if tc.policy {
			_, err = ParseRatePolicies(tc.in)
		} else {
			_, err = ParseRateRemaining(tc.in)
		}
		if !errors.Is(err, ErrBadField) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an ErrBadField saying %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParseRateRemaining(f *testing.F) {
	f.Add(`"10s";r=42;t=7, "group/1m";r=900;t=31`)
	f.Add(`"10s";q=100;w=10;qu="content-bytes";shadow`)
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := ParseRateRemaining(s)
		if err == nil && len(rs) == 0 {
			t.Fatal("no error and no item")
		}
		for _, r := range rs {
			if r.R < 0 || r.T < 0 {
				t.Fatalf("%q: negative %+v", s, r)
			}
		}
		_, _ = ParseRatePolicies(s)
	})
}
