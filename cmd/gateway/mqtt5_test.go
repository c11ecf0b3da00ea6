package main

import (
	"testing"

	"github.com/devicegate/devicegate/internal/mqtttest"
)

// MQTT 5 reason codes the tests look for.
const (
	codeSuccess       = mqtttest.CodeSuccess
	codeQuotaExceeded = mqtttest.CodeQuotaExceeded
)

// client5 is mqtttest's MQTT 5 device connection under this package's
// tests' names.
type client5 struct{ *mqtttest.Client5 }

func dial5(t *testing.T, addr, id string) *client5 { return &client5{mqtttest.Dial5(t, addr, id)} }

func (cl *client5) publish(topic, payload string) (byte, error) { return cl.Publish(topic, payload) }

func (cl *client5) mustPublish(t *testing.T, topic, payload string, want byte) {
	t.Helper()
	cl.MustPublish(t, topic, payload, want)
}

func (cl *client5) close() { cl.Close() }

// publishReason publishes and returns the PUBACK's reason code and
// reason string; a failed publish fails the test.
func (cl *client5) publishReason(t *testing.T, topic, payload string) (byte, string) {
	t.Helper()
	code, reason, err := cl.PublishReason(topic, payload)
	if err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
	return code, reason
}

// connectCode is mqtttest.ConnectCode.
func connectCode(t *testing.T, addr, id string) (byte, string) {
	t.Helper()
	return mqtttest.ConnectCode(t, addr, id)
}
