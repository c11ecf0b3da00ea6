package devicelimit

import (
	"fmt"
	"strings"
	"time"
)

// Bounds on quotas and tables.
const (
	// DefaultBuckets is the number of buckets a window is divided into
	// when the configuration does not say. A device sending evenly at
	// exactly its limit may see about 1/DefaultBuckets of its messages
	// refused; see Window.
	DefaultBuckets = 20
	// MaxBuckets bounds the bucket count: memory per device grows with it.
	MaxBuckets = 1000
	// MinBucketWidth is the smallest width of one bucket, Window/buckets.
	MinBucketWidth = time.Millisecond
	// MaxWindow is the longest quota window.
	MaxWindow = 30 * 24 * time.Hour
	// MaxLimit is the largest message count a quota may allow per window.
	MaxLimit = 1_000_000_000
	// MaxDeviceID is the longest device ID in bytes (an MQTT string).
	MaxDeviceID = 65535
)

// Policy says what happens to a message over its device's quota.
type Policy uint8

// The policies. The zero value is PolicyDrop.
const (
	// PolicyDrop drops the message and tells MQTT 5 publishers 0x97.
	PolicyDrop Policy = iota
	// PolicyDefer holds the message durably and releases it later.
	PolicyDefer
	// PolicyDisconnect disconnects the device (MQTT 5: DISCONNECT 0x96).
	PolicyDisconnect
)

var policyNames = [...]string{PolicyDrop: "drop", PolicyDefer: "defer", PolicyDisconnect: "disconnect"}

// String returns the policy's configuration name.
func (p Policy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// ParsePolicy returns the policy named s: drop, defer or disconnect.
func ParsePolicy(s string) (Policy, error) {
	for i, name := range policyNames {
		if s == name {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("%w: must be drop, defer or disconnect (got %q)", ErrInvalidPolicy, s)
}

// MarshalText implements encoding.TextMarshaler.
func (p Policy) MarshalText() ([]byte, error) {
	if int(p) >= len(policyNames) {
		return nil, fmt.Errorf("%w: %d", ErrInvalidPolicy, uint8(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *Policy) UnmarshalText(b []byte) error {
	v, err := ParsePolicy(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// Quota is "Limit messages per Window", and what to do above it; or,
// with NWindows > 0, the windows Windows[:NWindows] of messages or bytes
// (limits.go), Limit and Window then unused. A value, comparable with
// ==. The zero value is not a valid quota.
type Quota struct {
	Limit  int
	Window time.Duration
	Policy Policy
	// Feedback says when the device's acknowledgements carry its
	// standing (feedback.go); the zero value is DefaultFeedback's.
	Feedback Feedback
	Windows  [MaxWindows]Limit
	NWindows int
	// Shadow is shadow mode ("enforce: false"): messages are decided
	// and counted exactly as if the quota were enforced, and one it
	// would refuse passes all the same, counted as would-refuse.
	Shadow bool
	// Block, when After > 0, blocks a device this quota refused After
	// times within Within: disconnected, its CONNECTs refused for For.
	Block Block
}

// Block is automatic blocking: a device refused After times within
// Within is taken off the air for For.
type Block struct {
	After  int
	Within time.Duration
	For    time.Duration
}

// MaxBlock bounds a block's duration.
const MaxBlock = 30 * 24 * time.Hour

// validate checks b (none when After is 0); the error names the field
// under "block.".
func (b Block) validate(buckets int) error {
	if b == (Block{}) {
		return nil
	}
	bad := func(field, format string, args ...any) error {
		return &FieldError{Field: "block." + field, Msg: fmt.Sprintf(format, args...), Err: ErrInvalidQuota}
	}
	switch {
	case b.After < 1 || b.After > MaxLimit:
		return bad("after", "must be between 1 and %d refusals (got %d)", MaxLimit, b.After)
	case b.Within < time.Duration(buckets)*MinBucketWidth || b.Within > MaxWindow:
		return bad("within", "must be between %s and %s (got %q)", time.Duration(buckets)*MinBucketWidth, MaxWindow, b.Within.String())
	case b.For <= 0 || b.For > MaxBlock:
		return bad("for", "must be > 0 and at most %s (got %q)", MaxBlock, b.For.String())
	}
	return nil
}

// WithWindows returns a quota of the windows ls (at most MaxWindows are
// kept) and policy p.
func WithWindows(p Policy, ls ...Limit) Quota {
	q := Quota{Policy: p, NWindows: min(len(ls), MaxWindows)}
	copy(q.Windows[:], ls)
	return q
}

// Limits returns q's windows: Windows[:NWindows], or its one message
// window. (A decision path that must not allocate builds the one window
// in an array of its own instead: class.go.)
func (q Quota) Limits() []Limit {
	if q.NWindows > 0 {
		return q.Windows[:min(q.NWindows, MaxWindows)]
	}
	return []Limit{{Unit: Messages, N: q.Limit, Window: q.Window}}
}

// Describe says what the quota allows: "10 messages per 1s", or its
// windows, "10 messages per 1m0s, 5242880 bytes per 24h0m0s".
func (q Quota) Describe() string {
	if q.NWindows <= 0 || q.NWindows > MaxWindows {
		return fmt.Sprintf("%d messages per %s", q.Limit, q.Window)
	}
	var b strings.Builder
	for i, l := range q.Windows[:q.NWindows] {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s per %s", l.N, l.Unit, l.Window)
	}
	return b.String()
}

// TooLarge reports whether a message of size bytes is larger than one
// of q's byte windows can ever admit, and that window's limit.
func (q Quota) TooLarge(size int) (int, bool) {
	for _, l := range q.Windows[:min(max(q.NWindows, 0), MaxWindows)] {
		if l.Unit == Bytes && size > l.N {
			return l.N, true
		}
	}
	return 0, false
}

// Shortest returns the quota's shortest window (Window for one): the
// span of "once per window" logs.
func (q Quota) Shortest() time.Duration {
	if q.NWindows <= 0 || q.NWindows > MaxWindows {
		return q.Window
	}
	w := q.Windows[0].Window
	for _, l := range q.Windows[1:q.NWindows] {
		w = min(w, l.Window)
	}
	return w
}

// String formats the quota as "10/1s drop", or with several windows as
// "[10 messages/1m0s 5242880 bytes/24h0m0s] drop".
func (q Quota) String() string {
	shadow := ""
	if q.Shadow {
		shadow = " shadow"
	}
	if q.NWindows > 0 {
		return fmt.Sprintf("%v %s%s", q.Windows[:q.NWindows], q.Policy, shadow)
	}
	return fmt.Sprintf("%d/%s %s%s", q.Limit, q.Window, q.Policy, shadow)
}

// Validate reports whether q can be enforced by a table with the given
// bucket count: 1 <= Limit <= MaxLimit, MinBucketWidth*buckets <= Window
// <= MaxWindow, and a known policy. The error names the bad field and
// value.
func (q Quota) Validate(buckets int) error {
	if err := validBuckets(buckets); err != nil {
		return err
	}
	if err := q.Block.validate(buckets); err != nil {
		return err
	}
	if err := q.Feedback.validate(); err != nil {
		return err
	}
	bad := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...), Err: ErrInvalidQuota}
	}
	if q.NWindows != 0 {
		if int(q.Policy) >= len(policyNames) {
			return &FieldError{Field: "policy", Msg: fmt.Sprintf("must be drop, defer or disconnect (got %d)", uint8(q.Policy)), Err: ErrInvalidPolicy}
		}
		if q.NWindows < 0 || q.NWindows > MaxWindows {
			return bad("windows", "must hold 1 to %d windows (got %d)", MaxWindows, q.NWindows)
		}
		return ValidateLimits(q.Windows[:q.NWindows], buckets)
	}
	switch {
	case q.Limit < 1 || q.Limit > MaxLimit:
		return bad("limit", "must be between 1 and %d (got %d)", MaxLimit, q.Limit)
	case q.Window <= 0:
		return bad("window", "must be > 0 (got %q)", q.Window.String())
	case q.Window < MinBucketWidth:
		return bad("window", "must be at least %s (got %q)", MinBucketWidth, q.Window.String())
	case q.Window > MaxWindow:
		return bad("window", "must be at most %s (got %q)", MaxWindow, q.Window.String())
	case q.Window/time.Duration(buckets) < MinBucketWidth:
		return bad("window", "%s divided into %d buckets gives buckets shorter than %s; use a longer window or fewer buckets",
			q.Window, buckets, MinBucketWidth)
	case int(q.Policy) >= len(policyNames):
		return &FieldError{Field: "policy", Msg: fmt.Sprintf("must be drop, defer or disconnect (got %d)", uint8(q.Policy)), Err: ErrInvalidPolicy}
	}
	return nil
}

func validBuckets(buckets int) error {
	if buckets < 1 || buckets > MaxBuckets {
		return &FieldError{Field: "buckets", Msg: fmt.Sprintf("must be between 1 and %d (got %d)", MaxBuckets, buckets), Err: ErrInvalidBuckets}
	}
	return nil
}

// ValidDeviceID reports whether id can name a device: 1..MaxDeviceID
// bytes without NUL (an MQTT string holds none; a NUL starts a group's
// key, group.go).
func ValidDeviceID(id string) error {
	if id == "" {
		return &FieldError{Field: "device", Msg: "must not be empty", Err: ErrInvalidDevice}
	}
	if strings.IndexByte(id, 0) >= 0 {
		return &FieldError{Field: "device", Msg: "must not hold a NUL byte", Err: ErrInvalidDevice}
	}
	if len(id) > MaxDeviceID {
		return &FieldError{Field: "device", Msg: fmt.Sprintf("must be at most %d bytes (got %d)", MaxDeviceID, len(id)), Err: ErrInvalidDevice}
	}
	return nil
}

// ValidOverrideKey checks what an override is set for: a device ID, or
// a group's key (GroupKey).
func ValidOverrideKey(key string) error {
	if name, ok := GroupOfKey(key); ok {
		return ValidGroupName(name)
	}
	return ValidDeviceID(key)
}
