// Package mqtt3 holds what the gateway's MQTT 3.1.1 clients (the
// simulator's devices, the upstream forwarder) share about
// paho.mqtt.golang.
package mqtt3

import (
	"context"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Connect connects a client of opts, or gives up when ctx ends first. The
// error is the CONNECT's (a refusal, a dial error) or ctx's.
func Connect(ctx context.Context, opts *mqtt.ClientOptions) (mqtt.Client, error) {
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		c.Disconnect(0)
		return nil, ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	return c, nil
}
