// Package mqtt3 holds what the gateway's MQTT 3.1.1 clients on
// paho.mqtt.golang (the simulator's devices) share about it. The
// upstream forwarder has a client of its own (forward/mqtt3conn.go).
package mqtt3

import (
	"context"
	"errors"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// Connect connects a client of opts, or gives up when ctx ends first. The
// error is the CONNECT's (a refusal, a dial error) or ctx's. A network
// error reads as what failed ("dial tcp 127.0.0.1:1883: connect:
// connection refused"), not paho's "network Error : dial tcp ...",
// and still matches packets.ErrorNetworkError with errors.Is.
func Connect(ctx context.Context, opts *mqtt.ClientOptions) (mqtt.Client, error) {
	c, _, err := ConnectSession(ctx, opts)
	return c, err
}

// ConnectSession is Connect that also reports whether the server kept
// the client's session (the CONNACK's session present flag).
func ConnectSession(ctx context.Context, opts *mqtt.ClientOptions) (mqtt.Client, bool, error) {
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		c.Disconnect(0)
		return nil, false, ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return nil, false, plainNetworkError(err)
	}
	ct, ok := tok.(*mqtt.ConnectToken)
	return c, ok && ct.SessionPresent(), nil
}

// networkError is a network failure of a CONNECT, told as itself.
type networkError struct{ cause error }

func (e networkError) Error() string   { return e.cause.Error() }
func (e networkError) Unwrap() []error { return []error{packets.ErrorNetworkError, e.cause} }

// plainNetworkError returns err, or for paho's "network Error : CAUSE"
// (both wrapped) a networkError of CAUSE.
func plainNetworkError(err error) error {
	multi, ok := err.(interface{ Unwrap() []error })
	if !ok || !errors.Is(err, packets.ErrorNetworkError) {
		return err
	}
	for _, e := range multi.Unwrap() {
		if e != packets.ErrorNetworkError {
			return networkError{cause: e}
		}
	}
	return err
}
