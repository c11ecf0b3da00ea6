// Package freeport picks loopback TCP addresses that were free a moment
// ago: for servers that cannot bind port 0 themselves (redis-server,
// mosquitto), for a server restarted on the same address, and for an
// upstream known to be down. Another process may take the port between
// the pick and its use; callers that bind it themselves should bind
// 127.0.0.1:0 instead.
package freeport

import "net"

// Addr returns a loopback host:port that was free a moment ago.
func Addr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
