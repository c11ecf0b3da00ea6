package mqtt3

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// TestConnectNetworkError: a CONNECT to a port nobody listens on fails
// with the dial's own words, not paho's "network Error : dial tcp ...",
// and the error still matches packets.ErrorNetworkError.
func TestConnectNetworkError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Connect(ctx, mqtt.NewClientOptions().AddBroker("tcp://"+addr).SetConnectRetry(false).SetConnectTimeout(5*time.Second))
	if err == nil {
		t.Fatal("connected to a closed port")
	}
	if msg := err.Error(); strings.Contains(msg, "network Error") || !strings.HasPrefix(msg, "dial tcp "+addr) {
		t.Fatalf("error %q; want it to start with \"dial tcp %s\"", msg, addr)
	}
	if !errors.Is(err, packets.ErrorNetworkError) {
		t.Fatalf("error %v does not match packets.ErrorNetworkError", err)
	}
}
