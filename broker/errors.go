package broker

import (
	"errors"
	"fmt"
)

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
	// decoded: Start sets it aside as damaged (DeferStore.
	// SetAsideDeferred), logged with the device and sequence number,
	// rather than lose or mangle the message.
	ErrBadDeferred = errors.New("invalid deferred message record")
	// ErrCommandNotKept reports a command (Server.Publish) that a kept
	// session it reached could not store durably: the caller does not
	// acknowledge it upstream, so that the upstream sends it again.
	ErrCommandNotKept = errors.New("command not stored in a kept session")
	// ErrDamagedDeferred reports a stored deferred message whose
	// checksum does not match: Start sets it aside, counted and named,
	// and never releases it.
	ErrDamagedDeferred = errors.New("damaged deferred message record")
)

// ListenError is a listener that could not bind its address (in use,
// not permitted): Listener is its ID, "tcp", "tls" or "ws", so that the
// caller can name the setting that gave the address.
type ListenError struct {
	Listener, Addr string
	Err            error
}

func (e *ListenError) Error() string { return fmt.Sprintf("listen on %q: %v", e.Addr, e.Err) }
func (e *ListenError) Unwrap() error { return e.Err }
