package simulator

import "errors"

// Errors returned by the simulator; wrapped errors name the field or
// value.
var (
	// ErrInvalidConfig wraps every Config validation error.
	ErrInvalidConfig = errors.New("invalid simulator config")
	// ErrNotLoopback is returned for a target that is not a loopback
	// address: the simulator is a load generator and must not be aimed
	// at someone else's server.
	ErrNotLoopback = errors.New("target is not a loopback address")
	// ErrBadPayload is returned by DecodeHeader for bytes that are not a
	// simulator payload.
	ErrBadPayload = errors.New("not a simulator payload")
	// ErrBlocked reports a device the gateway blocked (automatic
	// blocking): disconnected with DISCONNECT 0x98, or refused at
	// CONNECT with 0x8A banned (MQTT 5).
	ErrBlocked = errors.New("blocked by the gateway")
)
