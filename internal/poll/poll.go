// Package poll waits in tests for something to happen over the network
// (a message to arrive, a connection to drop): it polls, it never lets
// time pass for its own sake.
package poll

import (
	"testing"
	"time"
)

// Until polls cond every 10 ms until it holds, failing the test after
// within.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond) // polling the network
	}
}
