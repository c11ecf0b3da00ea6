package devicelimit

import (
	"encoding/json"
	"testing"
	"time"
)

// TestQuotaJSON: a quota's JSON has snake_case keys and durations under
// _ns keys, only the windows it has; before, Go's field names ("Limit",
// "Window") and a zero-filled "Windows" array with "NWindows".
func TestQuotaJSON(t *testing.T) {
	for _, tc := range []struct {
		q    Quota
		want string
	}{
		{Quota{Limit: 5, Window: time.Second, Policy: PolicyDrop}, `{"limit":5,"window_ns":1000000000,"policy":"drop"}`},
		{WithWindows(PolicyDefer, Limit{N: 2, Window: time.Minute}, Limit{Unit: Bytes, N: 1000, Window: time.Hour}),
			`{"windows":[{"messages":2,"window_ns":60000000000},{"bytes":1000,"window_ns":3600000000000}],"policy":"defer"}`},
		{Quota{Limit: 1, Window: time.Second, Shadow: true, Block: Block{After: 3, Within: time.Minute, For: time.Hour}},
			`{"limit":1,"window_ns":1000000000,"policy":"drop","shadow":true,"block":{"after":3,"within_ns":60000000000,"for_ns":3600000000000}}`},
	} {
		b, err := json.Marshal(tc.q)
		if err != nil || string(b) != tc.want {
			t.Errorf("got %s, %v; want %s", b, err, tc.want)
		}
		var back Quota
		if err := json.Unmarshal(b, &back); err != nil || back != tc.q {
			t.Errorf("%s read back as %+v, %v; want %+v", b, back, err, tc.q)
		}
	}
}
