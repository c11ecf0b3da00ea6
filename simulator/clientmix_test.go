package simulator

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseClients(t *testing.T) {
	for in, want := range map[string][]ClientShare{
		"":                       {{100, ClientPaho}},
		"adaptive":               {{100, ClientAdaptive}},
		"50%:lean, 50%:adaptive": {{50, ClientLean}, {50, ClientAdaptive}},
		"25%:paho,75%:adaptive":  {{25, ClientPaho}, {75, ClientAdaptive}},
	} {
		got, err := ParseClients(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: got %v, %v, want %v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"smart":                 `"smart": want paho, lean, adaptive or a mix`,
		"50%:lean,40%:adaptive": "the shares add up to 90%",
		"50:lean,50%:adaptive":  `part 1 "50:lean": want SHARE%:CLIENT`,
		"50%:lean,50%:clever":   `part 2 "50%:clever": the client must be paho, lean or adaptive`,
	} {
		if _, err := ParseClients(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error saying %q", in, err, want)
		}
	}
}

// Clients take contiguous ranges of device numbers; adaptive devices
// need what they read feedback from.
func TestClientOfAndValidation(t *testing.T) {
	cfg := Config{Addr: "127.0.0.1:1883", Devices: 4, Rate: 1, QoS: 1, Duration: time.Minute, Quota: drop(5, time.Second), Client: "50%:lean,50%:adaptive"}
	c, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := range 4 {
		got = append(got, c.ClientOf(i))
	}
	if want := []string{"lean", "lean", "adaptive", "adaptive"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.QoS = 0 }, "qos must be 1 or 2"},
		{func(c *Config) { c.Protocol = 4 }, "speaks MQTT 5 only"},
		{func(c *Config) { c.StormAt = time.Second }, "do not reconnect"},
		{func(c *Config) { c.Client = "adaptive,lean" }, "want paho, lean, adaptive or a mix"},
	} {
		bad := cfg
		tc.edit(&bad)
		if _, err := bad.withDefaults(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an invalid config saying %q", err, tc.want)
		}
	}
}
