package auth

import "errors"

var (
	// ErrInvalidCredentials marks a credentials file (or an entry for
	// one) that cannot be used: a malformed line, an unknown hash format
	// or role, a bad client-ID pattern.
	ErrInvalidCredentials = errors.New("invalid credentials")
	// ErrInvalidTemplate marks an ACL topic template that cannot be
	// used.
	ErrInvalidTemplate = errors.New("invalid topic template")
	// ErrNoIdentity marks a client certificate that carries no identity
	// of the configured kind.
	ErrNoIdentity = errors.New("certificate has no identity")
)
