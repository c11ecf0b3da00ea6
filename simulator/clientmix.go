package simulator

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ClientAdaptive is the client of devices that obey the gateway's
// feedback (Config.Client): the lean client, pacing each message by the
// RateLimit of the acknowledgements before it (pacer.go, adaptive.go).
const ClientAdaptive = "adaptive"

// ClientShare is a part of the fleet on one client.
type ClientShare struct {
	// Share is the percentage of the fleet, > 0; a mix's add up to 100.
	Share float64 `json:"share"`
	// Client is ClientPaho, ClientLean or ClientAdaptive.
	Client string `json:"client"`
}

// ParseClients parses Config.Client: one client ("adaptive") for the
// whole fleet, or a mix "SHARE%:CLIENT,...", for example
// "50%:lean,50%:adaptive". Clients take contiguous ranges of device
// numbers in their order, as quota classes do (Config.ClassOf). The
// empty string is the default client, paho.
func ParseClients(s string) ([]ClientShare, error) {
	if strings.TrimSpace(s) == "" {
		return []ClientShare{{Share: 100, Client: ClientPaho}}, nil
	}
	if !strings.Contains(s, ":") {
		if !knownClient(s) {
			return nil, fmt.Errorf("%q: want paho, lean, adaptive or a mix such as 50%%:lean,50%%:adaptive", s)
		}
		return []ClientShare{{Share: 100, Client: s}}, nil
	}
	var out []ClientShare
	total := 0.0
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		share, client, ok := strings.Cut(part, ":")
		pct, isPct := parseShare(share)
		switch {
		case !ok || !isPct:
			return nil, fmt.Errorf("part %d %q: want SHARE%%:CLIENT such as 50%%:adaptive, the share a number in (0, 100]", i+1, part)
		case !knownClient(client):
			return nil, fmt.Errorf("part %d %q: the client must be paho, lean or adaptive", i+1, part)
		}
		total += pct
		out = append(out, ClientShare{Share: pct, Client: client})
	}
	if math.Abs(total-100) > 1e-6 {
		return nil, fmt.Errorf("the shares add up to %g%%, want 100%%", total)
	}
	return out, nil
}

func knownClient(s string) bool {
	return s == ClientPaho || s == ClientLean || s == ClientAdaptive
}

// parseShare parses a percentage "30%" in (0, 100].
func parseShare(s string) (float64, bool) {
	pct, ok := strings.CutSuffix(s, "%")
	if !ok {
		return 0, false
	}
	share, err := strconv.ParseFloat(pct, 64)
	return share, err == nil && share > 0 && share <= 100
}

// shareIndex returns the index of the part device i of devices falls
// in, parts taking contiguous ranges of device numbers in their order by
// their shares (percentages adding up to 100).
func shareIndex(i, devices int, shares func(k int) float64, parts int) int {
	cum := 0.0
	for k := range parts {
		cum += shares(k)
		if float64(i) < math.Round(cum/100*float64(devices)) {
			return k
		}
	}
	return parts - 1
}

// ClientOf returns device i's client.
func (c Config) ClientOf(i int) string {
	if len(c.clients) == 0 {
		cs, err := ParseClients(c.Client)
		if err != nil {
			return ClientPaho
		}
		c.clients = cs
	}
	k := shareIndex(i, c.Devices, func(k int) float64 { return c.clients[k].Share }, len(c.clients))
	return c.clients[k].Client
}

// validateClients checks Config.Client against the rest of the config
// and keeps the parsed mix.
func (c *Config) validateClients() error {
	cs, err := ParseClients(c.Client)
	if err != nil {
		return fmt.Errorf("%w: client: %v", ErrInvalidConfig, err)
	}
	for _, s := range cs {
		switch {
		case s.Client == ClientPaho:
		case c.Protocol != 5:
			return fmt.Errorf("%w: client: %s: %v (got protocol %d)", ErrInvalidConfig, s.Client, errLeanProtocol, c.Protocol)
		case s.Client != ClientAdaptive:
		case c.QoS == 0:
			return fmt.Errorf("%w: client: adaptive: %v (got qos 0)", ErrInvalidConfig, errAdaptiveQoS)
		case c.StormAt > 0 || c.RestartAt > 0:
			return fmt.Errorf("%w: client: adaptive: %v", ErrInvalidConfig, errAdaptiveFaults)
		}
	}
	c.clients = cs
	return nil
}

var (
	errAdaptiveQoS    = errors.New("adaptive devices read the feedback on PUBACK or PUBREC: qos must be 1 or 2")
	errAdaptiveFaults = errors.New("adaptive devices do not reconnect: no reconnect storm or gateway restart")
)
