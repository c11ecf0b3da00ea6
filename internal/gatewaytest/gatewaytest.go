// Package gatewaytest starts a whole gateway (server.Start) in a test's
// process, closed with the test.
package gatewaytest

import (
	"context"
	"sync"
	"testing"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/server"
)

// Start validates cfg, starts a gateway on it and closes it when the
// test ends (a failed close is a test error). The caller sets the
// listeners (loopback, port 0) and the data directory.
func Start(t testing.TB, cfg config.Config) *server.Gateway {
	t.Helper()
	g, _ := StartStoppable(t, cfg)
	return g
}

// StartStoppable is Start, with stop closing the gateway before the
// test ends (a restart on the same data directory); stop may be called
// more than once, and the test's end calls it if nobody did.
func StartStoppable(t testing.TB, cfg config.Config) (g *server.Gateway, stop func()) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g, err := server.Start(cfg, server.Deps{})
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), server.ShutdownTimeout)
			defer cancel()
			if err := g.Close(ctx); err != nil {
				t.Errorf("close gateway: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return g, stop
}
