package cluster

import "errors"

// Sentinel errors.
var (
	// ErrInvalidOptions reports Options New cannot use.
	ErrInvalidOptions = errors.New("invalid cluster options")
	// ErrInvalidPolicy reports an unknown failure policy name.
	ErrInvalidPolicy = errors.New("invalid failure policy")
	// ErrTimeout reports a decision Redis did not answer in time.
	ErrTimeout = errors.New("redis did not answer within the timeout")
	// ErrBadOverride reports an override record in Redis that cannot be
	// decoded.
	ErrBadOverride = errors.New("invalid override record")
	// ErrBadWindow reports a device's window key in Redis holding
	// something the window script cannot read.
	ErrBadWindow = errors.New("unreadable window record in redis")
	// ErrResetNotWritten, wrapped in Owner.Reset's error, says the
	// device's windows were emptied in the owner's table but Redis does
	// not hold that yet: the device's next checkpoint writes it, and a
	// crash of the owner before then brings the old counts back.
	ErrResetNotWritten = errors.New("reset not yet in the device's checkpoint in redis")
)
