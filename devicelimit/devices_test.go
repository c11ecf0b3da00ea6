package devicelimit

import (
	"slices"
	"testing"
	"time"
)

// Devices lists each device with a window once: not its topic classes'
// windows, not a group's, and no device whose window was reset.
func TestTableDevices(t *testing.T) {
	tab, err := NewTable(0)
	if err != nil {
		t.Fatal(err)
	}
	q := Quota{Limit: 5, Window: time.Minute}
	tab.AllowAt("a", q, t0)
	tab.AllowClassAt("a", "alarms", q, 10, t0)
	tab.AllowClassAt("b", "alarms", q, 10, t0) // b has only a class window
	tab.AllowGroupAt("c", "", q, GroupKey("acme"), q, 10, t0)
	tab.AllowAt("gone", q, t0)
	tab.Reset("gone")
	var got []string
	tab.Devices(func(d string) { got = append(got, d) })
	slices.Sort(got)
	if want := []string{"a", "c"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
