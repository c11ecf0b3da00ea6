package devicelimit

import "errors"

// FieldError is a value that fails validation: which field (as the
// configuration and the admin API name it: "limit", "window", "policy",
// "buckets", "device", "expires_at"), what is wrong with it, and the
// sentinel it is a case of (errors.Is finds it). Callers that put the
// field into a key of their own ("limits.default.limit") read Field and
// Msg instead of cutting the message apart.
type FieldError struct {
	Field string
	Msg   string // "must be between 1 and 1000000000 (got 0)"
	Err   error  // ErrInvalidQuota, ErrInvalidBuckets, ErrInvalidPolicy or ErrInvalidDevice
}

// Error reads "invalid quota: limit must be between 1 and ... (got 0)".
func (e *FieldError) Error() string { return e.Err.Error() + ": " + e.Field + " " + e.Msg }

func (e *FieldError) Unwrap() error { return e.Err }

// Sentinel errors. Functions wrap them with the offending value, so callers
// test with errors.Is and show err.Error() to people.
var (
	// ErrInvalidQuota reports a quota outside the accepted ranges.
	ErrInvalidQuota = errors.New("invalid quota")
	// ErrInvalidBuckets reports a bucket count outside 1..MaxBuckets.
	ErrInvalidBuckets = errors.New("invalid bucket count")
	// ErrInvalidPolicy reports an unknown policy name.
	ErrInvalidPolicy = errors.New("invalid policy")
	// ErrInvalidPattern reports a malformed client-ID or username glob.
	ErrInvalidPattern = errors.New("invalid pattern")
	// ErrUnknownRule reports a rule name no configured rule has.
	ErrUnknownRule = errors.New("no such rule")
	// ErrInvalidDevice reports an empty or oversized device ID.
	ErrInvalidDevice = errors.New("invalid device id")
	// ErrBadSnapshot reports window bytes that cannot be decoded.
	ErrBadSnapshot = errors.New("bad window snapshot")
)
