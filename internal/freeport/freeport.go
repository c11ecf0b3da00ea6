// Package freeport picks loopback TCP addresses that were free a moment
// ago: for servers that cannot bind port 0 themselves (redis-server,
// mosquitto, nats-server), for a server restarted on the same address,
// and for an upstream known to be down.
//
// The ports come from below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), where neither an outgoing
// connection nor a listener on port 0 is ever given a port: on a busy
// machine those two took a port picked from the ephemeral range between
// the pick and its use ("address already in use"). What remains is
// another process picking the same port the same way, which a random
// pick among ~20,000 ports makes rare and which a caller starting a
// server survives by starting it again on a new pick
// (internal/proctest.NewServerOnFreePort). Callers that bind the port
// themselves should bind 127.0.0.1:0 instead.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the lowest port picked: below it live well-known and
// registered services' defaults.
const lowest = 10000

var (
	mu     sync.Mutex
	handed = map[int]bool{} // ports this process handed out already
)

// Addr returns a loopback host:port below the ephemeral port range that
// nothing listened on a moment ago, never the same twice in one process.
func Addr() (string, error) {
	high := ephemeralLow()
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		p := lowest + rand.IntN(high-lowest)
		if handed[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		addr := l.Addr().String()
		l.Close()
		handed[p] = true
		return addr, nil
	}
	return "", fmt.Errorf("no free loopback port in %d-%d after 1000 tries", lowest, high-1)
}

// ephemeralLow returns the lowest port of the kernel's ephemeral range,
// or 32768 (Linux's default) where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > lowest+1000 {
				return n
			}
		}
	}
	return 32768
}
