// Package auth holds what the gateway needs to know who a client is and
// what it may touch, without any MQTT: the credentials file (accounts
// with bcrypt or argon2id password hashes, client-ID globs and a role),
// the topic ACL templates of devices, the device identity in a TLS
// client certificate, and the TLS configuration of a listener.
//
// The credentials file has one account per line,
//
//	username:hash:role:client-id-patterns
//
// with '#' comment lines; Put rewrites it atomically. Credentials checks
// logins and is safe for concurrent use; ACL checks topics without
// allocating. The broker's auth hook uses both.
package auth
