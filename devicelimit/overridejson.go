package devicelimit

import (
	"encoding/json"
	"fmt"
	"time"
)

// The JSON form of an override with topic classes, shadow mode or a block,
// which the data file (persist's version 3 override record) and Redis
// (cluster's "v3" records) store: JSON keeps the class names and topic
// filters, any strings, readable and unambiguous. Other overrides keep
// their older, compact encodings.

// NeedsJSON reports whether o is stored in its JSON form: it has topic
// classes, or a quota in shadow mode, with a block or a feedback mode.
func (o Override) NeedsJSON() bool {
	return len(o.Classes) > 0 || o.Quota.Shadow || o.Quota.Block != (Block{}) || o.Quota.Feedback != (Feedback{})
}

type quotaRecord struct {
	Limit   int           `json:"limit,omitempty"`
	Window  time.Duration `json:"window,omitempty"`
	Windows []limitRecord `json:"windows,omitempty"`
	Policy  Policy        `json:"policy"`
	Shadow  bool          `json:"shadow,omitempty"`
	Block   *blockRecord  `json:"block,omitempty"`
	// Feedback is Feedback.String's form; absent for the default.
	Feedback string `json:"feedback,omitempty"`
}

type blockRecord struct {
	After  int           `json:"after"`
	Within time.Duration `json:"within"`
	For    time.Duration `json:"for"`
}

func blockToRecord(b Block) *blockRecord {
	if b == (Block{}) {
		return nil
	}
	return &blockRecord{After: b.After, Within: b.Within, For: b.For}
}

func (r *blockRecord) block() Block {
	if r == nil {
		return Block{}
	}
	return Block{After: r.After, Within: r.Within, For: r.For}
}

type limitRecord struct {
	Bytes  bool          `json:"bytes,omitempty"`
	N      int           `json:"n"`
	Window time.Duration `json:"window"`
}

type classRecord struct {
	Name   string      `json:"name"`
	Topics []string    `json:"topics"`
	Quota  quotaRecord `json:"quota"`
}

type overrideRecord struct {
	Quota   quotaRecord   `json:"quota"`
	Expires Tick          `json:"expires,omitempty"`
	Classes []classRecord `json:"classes"`
}

func quotaToRecord(q Quota) quotaRecord {
	if q.NWindows == 0 {
		return quotaRecord{Limit: q.Limit, Window: q.Window, Policy: q.Policy, Shadow: q.Shadow, Block: blockToRecord(q.Block), Feedback: q.Feedback.String()}
	}
	r := quotaRecord{Policy: q.Policy, Shadow: q.Shadow, Block: blockToRecord(q.Block), Feedback: q.Feedback.String()}
	for _, l := range q.Limits() {
		r.Windows = append(r.Windows, limitRecord{Bytes: l.Unit == Bytes, N: l.N, Window: l.Window})
	}
	return r
}

func (r quotaRecord) quota() (Quota, error) {
	var fb Feedback
	if r.Feedback != "" {
		var err error
		if fb, err = ParseFeedback(r.Feedback); err != nil {
			return Quota{}, err
		}
	}
	if len(r.Windows) == 0 {
		return Quota{Limit: r.Limit, Window: r.Window, Policy: r.Policy, Shadow: r.Shadow, Block: r.Block.block(), Feedback: fb}, nil
	}
	if r.Limit != 0 || r.Window != 0 || len(r.Windows) > MaxWindows {
		return Quota{}, fmt.Errorf("a quota of limit and window, or of 1 to %d windows", MaxWindows)
	}
	ls := make([]Limit, len(r.Windows))
	for i, w := range r.Windows {
		ls[i] = Limit{N: w.N, Window: w.Window}
		if w.Bytes {
			ls[i].Unit = Bytes
		}
	}
	q := WithWindows(r.Policy, ls...)
	q.Shadow, q.Block, q.Feedback = r.Shadow, r.Block.block(), fb
	return q, nil
}

// MarshalOverride returns o's JSON form.
func MarshalOverride(o Override) []byte {
	r := overrideRecord{Quota: quotaToRecord(o.Quota), Expires: o.ExpiresAt, Classes: []classRecord{}}
	for _, c := range o.Classes {
		r.Classes = append(r.Classes, classRecord{Name: c.Name, Topics: c.Topics, Quota: quotaToRecord(c.Quota)})
	}
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // only strings, numbers and known policies
	}
	return b
}

// UnmarshalOverride reads MarshalOverride's form. It checks the shape,
// not the ranges (Override.Validate does).
func UnmarshalOverride(b []byte) (Override, error) {
	var r overrideRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return Override{}, err
	}
	q, err := r.Quota.quota()
	if err != nil {
		return Override{}, err
	}
	o := Override{Quota: q, ExpiresAt: r.Expires}
	for i, c := range r.Classes {
		cq, err := c.Quota.quota()
		if err != nil {
			return Override{}, fmt.Errorf("classes[%d]: %w", i, err)
		}
		o.Classes = append(o.Classes, Class{Name: c.Name, Topics: c.Topics, Quota: cq})
	}
	return o, nil
}

// membershipRecord is a group's label and quota as cluster's group
// registry shares them; the name is the registry's field.
type membershipRecord struct {
	Label string      `json:"label"`
	Quota quotaRecord `json:"quota"`
}

// MarshalMembership returns the JSON form of m's label and quota.
func MarshalMembership(m Membership) []byte {
	b, err := json.Marshal(membershipRecord{Label: m.Label, Quota: quotaToRecord(m.Quota)})
	if err != nil {
		panic(err) // only strings, numbers and known policies
	}
	return b
}

// UnmarshalMembership reads MarshalMembership's form as the membership
// of group name. It checks the shape and the group quota's ranges.
func UnmarshalMembership(name string, b []byte, buckets int) (Membership, error) {
	var r membershipRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return Membership{}, err
	}
	q, err := r.Quota.quota()
	if err != nil {
		return Membership{}, err
	}
	if err := ValidGroupName(name); err != nil {
		return Membership{}, err
	}
	if err := ValidateGroupQuota(q, buckets); err != nil {
		return Membership{}, err
	}
	return Membership{Name: name, Key: GroupKey(name), Quota: q, Label: r.Label}, nil
}
