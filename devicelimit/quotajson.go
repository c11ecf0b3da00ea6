package devicelimit

import (
	"encoding/json"
	"time"
)

// quotaJSON is the JSON form of a Quota in reports (the simulator's
// --json): snake_case keys and durations in nanoseconds under keys
// ending in _ns, like the rest of those reports; only the windows a
// quota has, and shadow and block only when set.
type quotaJSON struct {
	Limit   int           `json:"limit,omitempty"`
	Window  time.Duration `json:"window_ns,omitempty"`
	Windows []windowJSON  `json:"windows,omitempty"`
	Policy  Policy        `json:"policy"`
	Shadow  bool          `json:"shadow,omitempty"`
	Block   *blockJSON    `json:"block,omitempty"`
}

type windowJSON struct {
	Messages int           `json:"messages,omitempty"`
	Bytes    int           `json:"bytes,omitempty"`
	Window   time.Duration `json:"window_ns"`
}

type blockJSON struct {
	After  int           `json:"after"`
	Within time.Duration `json:"within_ns"`
	For    time.Duration `json:"for_ns"`
}

// MarshalJSON writes q as {"limit":N,"window_ns":T,"policy":P} for one
// window of messages, {"windows":[{"messages"|"bytes":N,"window_ns":T},
// ...],"policy":P} for several, with "shadow" and "block" when set.
// Stored overrides have a form of their own (overridejson.go).
func (q Quota) MarshalJSON() ([]byte, error) {
	j := quotaJSON{Policy: q.Policy, Shadow: q.Shadow}
	if q.NWindows == 0 {
		j.Limit, j.Window = q.Limit, q.Window
	} else {
		for _, l := range q.Limits() {
			w := windowJSON{Window: l.Window}
			if l.Unit == Bytes {
				w.Bytes = l.N
			} else {
				w.Messages = l.N
			}
			j.Windows = append(j.Windows, w)
		}
	}
	if q.Block != (Block{}) {
		j.Block = &blockJSON{After: q.Block.After, Within: q.Block.Within, For: q.Block.For}
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes. It does not validate the
// quota (Quota.Validate does).
func (q *Quota) UnmarshalJSON(b []byte) error {
	var j quotaJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	if len(j.Windows) > 0 {
		ls := make([]Limit, 0, len(j.Windows))
		for _, w := range j.Windows {
			l := Limit{N: w.Messages, Window: w.Window}
			if w.Bytes > 0 {
				l = Limit{Unit: Bytes, N: w.Bytes, Window: w.Window}
			}
			ls = append(ls, l)
		}
		if len(ls) > MaxWindows {
			ls = ls[:MaxWindows]
		}
		*q = WithWindows(j.Policy, ls...)
	} else {
		*q = Quota{Limit: j.Limit, Window: j.Window, Policy: j.Policy}
	}
	q.Shadow = j.Shadow
	if j.Block != nil {
		q.Block = Block{After: j.Block.After, Within: j.Block.Within, For: j.Block.For}
	}
	return nil
}
