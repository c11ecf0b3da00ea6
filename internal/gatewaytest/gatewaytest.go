// Package gatewaytest starts a whole gateway (server.Start) in a test's
// process, closed with the test.
package gatewaytest

import (
	"context"
	"testing"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/server"
)

// Start validates cfg, starts a gateway on it and closes it when the
// test ends (a failed close is a test error). The caller sets the
// listeners (loopback, port 0) and the data directory.
func Start(t testing.TB, cfg config.Config) *server.Gateway {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g, err := server.Start(cfg, server.Deps{})
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), server.ShutdownTimeout)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			t.Errorf("close gateway: %v", err)
		}
	})
	return g
}
