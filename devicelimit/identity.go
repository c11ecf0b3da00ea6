package devicelimit

import "fmt"

// Identity says which MQTT field names a device. State belongs to the
// device, not the connection: two connections with one identity share a
// window, and a reconnect keeps it.
type Identity uint8

// The identities. The zero value is IdentityClientID.
const (
	// IdentityClientID names a device by its MQTT client ID.
	IdentityClientID Identity = iota
	// IdentityUsername names a device by its MQTT username.
	IdentityUsername
)

// String returns the identity's configuration name.
func (i Identity) String() string {
	if i == IdentityUsername {
		return "username"
	}
	return "client_id"
}

// ParseIdentity returns the identity named s: client_id or username.
func ParseIdentity(s string) (Identity, error) {
	switch s {
	case "client_id":
		return IdentityClientID, nil
	case "username":
		return IdentityUsername, nil
	}
	return 0, fmt.Errorf("must be client_id or username (got %q)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (i Identity) MarshalText() ([]byte, error) {
	if i > IdentityUsername {
		return nil, fmt.Errorf("must be client_id or username (got %d)", uint8(i))
	}
	return []byte(i.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (i *Identity) UnmarshalText(b []byte) error {
	v, err := ParseIdentity(string(b))
	if err != nil {
		return err
	}
	*i = v
	return nil
}

// Of returns the device ID of a connection with this client ID and
// username.
func (i Identity) Of(clientID, username string) string {
	if i == IdentityUsername {
		return username
	}
	return clientID
}
