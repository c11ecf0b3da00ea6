package simulator

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

func TestParseMix(t *testing.T) {
	got, err := ParseMix("70%:50/10s:drop, 30%:5/1s:defer", devicelimit.PolicyDrop)
	if err != nil {
		t.Fatal(err)
	}
	want := []Class{
		{Share: 70, Quota: devicelimit.Quota{Limit: 50, Window: 10 * time.Second, Policy: devicelimit.PolicyDrop}},
		{Share: 30, Quota: devicelimit.Quota{Limit: 5, Window: time.Second, Policy: devicelimit.PolicyDefer}},
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if s := FormatMix(got); s != "70%:50/10s:drop,30%:5/1s:defer" {
		t.Fatalf("FormatMix: %q", s)
	}
	// Several windows, bytes.
	got, err = ParseMix("50%:10/1m+5KiB/1h:drop,50%:2KiB/10s", devicelimit.PolicyDefer)
	want = []Class{
		{Share: 50, Quota: devicelimit.WithWindows(devicelimit.PolicyDrop, devicelimit.Limit{N: 10, Window: time.Minute}, devicelimit.Limit{Unit: devicelimit.Bytes, N: 5120, Window: time.Hour})},
		{Share: 50, Quota: devicelimit.WithWindows(devicelimit.PolicyDefer, devicelimit.Limit{Unit: devicelimit.Bytes, N: 2048, Window: 10 * time.Second})},
	}
	if err != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("several windows: %+v, %v", got, err)
	}
	if s := FormatMix(got); s != "50%:10/1m+5KiB/1h:drop,50%:2KiB/10s:defer" {
		t.Fatalf("FormatMix of several windows: %q", s)
	}
	// A class without a policy takes the default.
	if got, err := ParseMix("100%:3/1s", devicelimit.PolicyDefer); err != nil || got[0].Quota.Policy != devicelimit.PolicyDefer {
		t.Fatalf("got %+v, %v", got, err)
	}
	if got, err := ParseMix(" ", devicelimit.PolicyDrop); err != nil || got != nil {
		t.Fatalf("empty: got %+v, %v", got, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"70%:50/10s", "add up to 70%"},
		{"70:50/10s,30%:1/1s", "class 1 \"70:50/10s\": the share must end in %"},
		{"0%:5/1s,100%:1/1s", "the share must be a number in (0, 100]"},
		{"100%:5", `the quota: "5" is not N/DURATION or SIZE/DURATION`},
		{"100%:x/1s", `"x" is neither a message count nor a size with a unit such as 5MiB`},
		{"100%:0/1s", "the count must be at least 1"},
		{"100%:5/1", `"1" is not a duration such as 1m`},
		{"100%:5/0s", "the window must be a duration > 0"},
		{"100%:1/1s+2/1s+3/1s+4/1s+5/1s", "at most 4 windows"},
		{"100%:5/1s:queue", "the policy must be drop, defer or disconnect"},
		{"100%", "want 2 or 3 fields"},
		{"50%:5/1s,50%:5/1s:drop:x", "class 2"},
	} {
		if _, err := ParseMix(tc.in, devicelimit.PolicyDrop); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseMix(%q): %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestClassOf(t *testing.T) {
	a := devicelimit.Quota{Limit: 1, Window: time.Second}
	b := devicelimit.Quota{Limit: 2, Window: time.Second}
	c := Config{Devices: 10, Mix: []Class{{Share: 70, Quota: a}, {Share: 30, Quota: b}}}
	var got []int
	for i := range 10 {
		got = append(got, c.ClassOf(i))
	}
	if want := []int{0, 0, 0, 0, 0, 0, 0, 1, 1, 1}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v", got, want)
	}
	if c.QuotaOf(8) != b || c.QuotaOf(0) != a {
		t.Fatalf("QuotaOf: %v %v", c.QuotaOf(8), c.QuotaOf(0))
	}
	if (Config{Devices: 3, Quota: a}).ClassOf(1) != -1 {
		t.Fatal("no mix: want class -1")
	}
}

func FuzzParseMix(f *testing.F) {
	for _, s := range []string{"70%:50/10s:drop,30%:5/1s:defer", "100%:1/1ms", "", "50%:1/1s,50%:2/2s:disconnect"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		mix, err := ParseMix(s, devicelimit.PolicyDrop)
		if err != nil {
			return
		}
		if len(mix) == 0 {
			return
		}
		again, err := ParseMix(FormatMix(mix), devicelimit.PolicyDrop)
		if err != nil || len(again) != len(mix) {
			t.Fatalf("round trip of %q: %v", FormatMix(mix), err)
		}
		for _, c := range mix {
			if c.Quota.Limit <= 0 || c.Quota.Window <= 0 || !(c.Share > 0) {
				t.Fatalf("accepted a bad class %+v", c)
			}
		}
	})
}
