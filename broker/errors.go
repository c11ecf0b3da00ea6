package broker

import "errors"

// Sentinel errors. Functions wrap them with the offending value, so callers
// test with errors.Is and show err.Error() to people.
var (
	// ErrInvalidOptions reports an Options value New cannot use.
	ErrInvalidOptions = errors.New("invalid broker options")
	// ErrStarted reports a second call to Start.
	ErrStarted = errors.New("broker already started")
	// ErrClosed reports a Start after Close.
	ErrClosed = errors.New("broker closed")
	// ErrBadDeferred reports a stored deferred message that cannot be
	// decoded: Start fails with it, naming the device and sequence
	// number, rather than lose or mangle the message.
	ErrBadDeferred = errors.New("invalid deferred message record")
)
