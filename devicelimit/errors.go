package devicelimit

import "errors"

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
	// ErrInvalidDevice reports an empty or oversized device ID.
	ErrInvalidDevice = errors.New("invalid device id")
	// ErrBadSnapshot reports window bytes that cannot be decoded.
	ErrBadSnapshot = errors.New("bad window snapshot")
)
