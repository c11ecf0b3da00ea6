package simulator

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Patterns a device can publish in.
const (
	PatternSteady  = "steady"  // one message every 1/Rate
	PatternBurst   = "burst"   // Burst messages back to back every Period
	PatternPoisson = "poisson" // exponential gaps of mean 1/Rate
)

// Config describes a simulated fleet. Fill it, then call Run; zero
// fields take the defaults documented on them.
type Config struct {
	// Addr is the gateway's MQTT address, host:port. Only loopback
	// hosts (127.0.0.0/8, ::1, localhost) are allowed.
	Addr string `json:"addr"`
	// Addrs, when set, are several gateways' addresses (a cluster of
	// gateways), used as device SDKs use a list: device i connects to
	// Addrs[i mod n] first and moves to the next address when a connect
	// fails or, with Failover, its connection is lost. Addr defaults to
	// Addrs[0]. Loopback only.
	Addrs []string `json:"addrs,omitempty"`
	// SubAddrs, when set, put one subscriber at each address instead of
	// one at Addr: gateways of a cluster share windows, not messages, so
	// each gateway's arrivals are counted at that gateway. A subscriber
	// whose gateway goes away is noted, not a failure of the run: the
	// messages that gateway acknowledged and never delivered count as
	// lost. Loopback only.
	SubAddrs []string `json:"sub_addrs,omitempty"`
	// SourceAddrs, when set, are loopback IP addresses (127.0.0.2,
	// 127.0.0.3, ...) device i dials from, SourceAddrs[i mod n]: a
	// gateway bounds some things per source address (its connections
	// that have not sent CONNECT yet, mqtt.max_pending_per_address), and
	// one source address has one range of ephemeral ports per
	// destination.
	SourceAddrs []string `json:"source_addrs,omitempty"`
	// Failover makes a device whose connection is lost (its gateway
	// killed, the connection cut) connect again, to the next of Addrs,
	// instead of stopping; Report.Failovers has how long each took.
	Failover bool `json:"failover,omitempty"`
	// SubAddr, when set, is where the subscriber counts arrivals
	// instead of Addr: an upstream broker the gateway forwards to
	// (plain TCP, no login). The checker then judges loss, duplicates,
	// order and the quota end to end. Loopback only.
	SubAddr string `json:"sub_addr,omitempty"`
	// Devices is the fleet size (> 0).
	Devices int `json:"devices"`
	// IDPattern makes device i's client ID with fmt.Sprintf; default
	// "dev-%05d".
	IDPattern string `json:"id_pattern"`
	// Rate is messages per second per device for steady and poisson.
	Rate float64 `json:"rate"`
	// Pattern is steady (default), burst or poisson.
	Pattern string `json:"pattern"`
	// Burst and Period shape the burst pattern.
	Burst  int           `json:"burst,omitempty"`
	Period time.Duration `json:"period_ns,omitempty"`
	// QoS is 0, 1 or 2 for device publishes; the subscriber uses 1, or
	// 2 when devices do.
	QoS byte `json:"qos"`
	// Protocol is 5 (default, paho.golang) or 4 (MQTT 3.1.1,
	// paho.mqtt.golang). A 3.1.1 PUBACK carries no verdict, so its
	// messages are recorded with AckNone, like QoS 0.
	Protocol int `json:"protocol"`
	// Client is the devices' MQTT client: ClientPaho (the default:
	// paho.golang for MQTT 5, paho.mqtt.golang for 3.1.1), ClientLean
	// for runs at scale (MQTT 5 only; lean.go), ClientAdaptive (the
	// lean client obeying the gateway's feedback; pacer.go), or a mix
	// of them, "50%:lean,50%:adaptive" (ParseClients, ClientOf).
	Client string `json:"client,omitempty"`
	// clients is Client parsed by validation.
	clients []ClientShare
	// PayloadSize pads payloads to this many bytes; the header is never
	// cut.
	PayloadSize int `json:"payload_size"`
	// Topic makes a device's topic from its ID; default
	// "devices/%s/sim-RUNID" (inside the gateway's default topic ACL,
	// devices/{device}/#), RUNID a random 8-hex-digit ID of this run, so that
	// runs at the same time against one gateway do not see each other's
	// messages. The subscriber's filter is Topic with %s replaced by "+".
	Topic string `json:"topic"`
	// RunID is the run's ID in the default Topic; random by default.
	RunID string `json:"run_id"`
	// Duration is how long devices publish, counted from the start of
	// the run (> 0).
	Duration time.Duration `json:"duration_ns"`
	// RampUp is connections started per second; 0 connects all at once.
	RampUp float64 `json:"ramp_up"`
	// Drain is how long to wait after publishing stops for success-acked
	// messages still in flight; default 2 s.
	Drain time.Duration `json:"drain_ns"`
	// Quota is what the gateway is expected to enforce on every device;
	// the checker judges arrivals against it.
	Quota devicelimit.Quota `json:"quota"`
	// Mix, when not empty, replaces Quota: each device is judged
	// against its class's quota (see ClassOf). Shares add up to 100.
	Mix []Class `json:"mix,omitempty"`
	// TopicClasses send some of every device's messages on the topics
	// of the gateway's topic classes, each judged by its class's quota
	// apart from the device's own.
	TopicClasses []TopicClass `json:"topic_classes,omitempty"`
	// Group, when set, is the gateway's group all the fleet's devices
	// are in (a tenant): the checker judges them together against its
	// windows too.
	Group *Group `json:"group,omitempty"`
	// Flood devices, the first of the fleet, publish steadily at
	// FloodRate messages per second instead of Rate and Pattern: a
	// faulty sensor among calm ones (with Group, a tenant's flooding
	// device).
	Flood     int     `json:"flood,omitempty"`
	FloodRate float64 `json:"flood_rate,omitempty"`
	// Tolerance and Immediate are passed to the checker (CheckOptions).
	// Tolerance defaults to 50 ms; Immediate to 250 ms.
	Tolerance time.Duration `json:"tolerance_ns"`
	Immediate time.Duration `json:"immediate_ns"`
	// Seed seeds the poisson pattern; runs with the same seed publish
	// the same gaps.
	Seed uint64 `json:"seed"`

	// Auth holds the credentials and TLS settings of the devices and
	// the subscriber (see auth.go); the zero value connects without.
	Auth Auth `json:"auth"`

	// Faults: see faults.go.
	Faults
	// Progress, when not nil, is called about every ProgressEvery
	// (default 1 s) while devices publish, from one goroutine.
	Progress      func(Progress) `json:"-"`
	ProgressEvery time.Duration  `json:"-"`
}

// The devices' clients (Config.Client).
const (
	ClientPaho = "paho"
	ClientLean = "lean"
)

// TopicClass is a topic class of the gateway (limits.classes) that
// devices send some of their messages in.
type TopicClass struct {
	// Name is the class's name in the gateway's configuration.
	Name string `json:"name"`
	// Topic makes a device's topic in the class from its ID (one %s),
	// a topic one of the class's filters matches.
	Topic string `json:"topic"`
	// Every: a device's messages number Every-1, 2*Every-1, ... (counting
	// from 0) go to this class; the first class that takes a message
	// has it, the others' go to Config.Topic.
	Every int `json:"every"`
	// Quota is the class's quota in the gateway.
	Quota devicelimit.Quota `json:"quota"`
}

// ClassTopic returns the topic template and class name of message seq
// of a device: a topic class's, or Topic's and "".
func (c *Config) ClassTopic(seq uint64) (string, string) {
	for _, tc := range c.TopicClasses {
		if seq%uint64(tc.Every) == uint64(tc.Every-1) {
			return tc.Topic, tc.Name
		}
	}
	return c.Topic, ""
}

// quotaOK reports whether every window of q has a limit and a length.
func quotaOK(q devicelimit.Quota) bool {
	if q.NWindows > devicelimit.MaxWindows {
		return false
	}
	for _, l := range q.Limits() {
		if l.N <= 0 || l.Window <= 0 {
			return false
		}
	}
	return true
}

// withDefaults returns c with zero fields defaulted, validated.
func (c Config) withDefaults() (Config, error) {
	if c.IDPattern == "" {
		c.IDPattern = "dev-%05d"
	}
	if c.Pattern == "" {
		c.Pattern = PatternSteady
	}
	if c.Protocol == 0 {
		c.Protocol = 5
	}
	if c.RunID == "" {
		c.RunID = fmt.Sprintf("%08x", rand.Uint32())
	}
	if c.Topic == "" {
		c.Topic = "devices/%s/sim-" + c.RunID
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = time.Second
	}
	if c.Drain == 0 {
		c.Drain = 2 * time.Second
		if c.SubAddr != "" {
			// A backlog forwarded after an outage takes its time; the
			// drain ends as soon as everything acknowledged arrived.
			c.Drain = time.Minute
		}
	}
	if c.Tolerance == 0 {
		c.Tolerance = 50 * time.Millisecond
	}
	if c.Immediate == 0 {
		c.Immediate = 250 * time.Millisecond
	}
	bad := func(field string, v any, why string) (Config, error) {
		return c, fmt.Errorf("%w: %s: %s (got %v)", ErrInvalidConfig, field, why, v)
	}
	if err := c.validateAddrs(); err != nil {
		return c, err
	}
	if err := checkLoopback(c.Addr); err != nil {
		return c, err
	}
	if c.SubAddr != "" {
		if err := checkLoopback(c.SubAddr); err != nil {
			return c, err
		}
	}
	switch {
	case c.Devices <= 0:
		return bad("devices", c.Devices, "must be > 0")
	case !strings.Contains(c.IDPattern, "%"):
		return bad("id_pattern", c.IDPattern, "must contain a verb for the device number")
	case strings.Count(c.Topic, "%s") != 1:
		return bad("topic", c.Topic, "must contain %s exactly once")
	case c.Duration <= 0:
		return bad("duration", c.Duration, "must be > 0")
	case c.QoS > 2:
		return bad("qos", c.QoS, "must be 0, 1 or 2")
	case c.Protocol != 4 && c.Protocol != 5:
		return bad("protocol", c.Protocol, "must be 4 or 5")
	case c.RampUp < 0 || math.IsNaN(c.RampUp):
		return bad("ramp_up", c.RampUp, "must be >= 0")
	case c.Drain < 0:
		return bad("drain", c.Drain, "must be >= 0")
	case len(c.Mix) == 0 && !quotaOK(c.Quota):
		return bad("quota", c.Quota, "must have a limit and a window > 0")
	case c.Flood < 0 || c.Flood > c.Devices:
		return bad("flood", c.Flood, fmt.Sprintf("must be between 0 and the fleet's %d devices", c.Devices))
	case c.Flood > 0 && !(c.FloodRate > 0):
		return bad("flood_rate", c.FloodRate, "must be > 0 with flood devices")
	case c.Group != nil && (c.Group.Name == "" || !quotaOK(c.Group.Quota)):
		return bad("group", c.Group, "must have a name and windows with a limit and a length > 0")
	}
	names := map[string]bool{}
	for i, tc := range c.TopicClasses {
		field := fmt.Sprintf("topic_classes[%d]", i)
		switch {
		case tc.Name == "" || names[tc.Name]:
			return bad(field+".name", fmt.Sprintf("%q", tc.Name), "must be a class name, once")
		case strings.Count(tc.Topic, "%s") != 1:
			return bad(field+".topic", tc.Topic, "must contain %s exactly once")
		case tc.Every < 1:
			return bad(field+".every", tc.Every, "must be >= 1")
		case !quotaOK(tc.Quota):
			return bad(field+".quota", tc.Quota, "must have a limit and a window > 0")
		}
		names[tc.Name] = true
	}
	if len(c.Mix) > 0 {
		total := 0.0
		for _, cl := range c.Mix {
			if !(cl.Share > 0) || !quotaOK(cl.Quota) {
				return bad("mix", FormatMix(c.Mix), "every class needs a share > 0, a limit and a window > 0")
			}
			total += cl.Share
		}
		if math.Abs(total-100) > 1e-6 {
			return bad("mix", FormatMix(c.Mix), "shares must add up to 100%")
		}
	}
	c.Auth.TLSOn = c.Auth.TLS != nil
	switch {
	case c.Auth.Password != "" && c.Auth.Username == "":
		return bad("auth.password", "(hidden)", "needs a username")
	case c.Auth.SubPassword != "" && c.Auth.SubUsername == "":
		return bad("auth.sub_password", "(hidden)", "needs a sub_username")
	}
	if err := c.Faults.validate(c.Duration); err != nil {
		return c, err
	}
	if err := c.validateClients(); err != nil {
		return c, err
	}
	switch c.Pattern {
	case PatternSteady, PatternPoisson:
		if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
			return bad("rate", c.Rate, "must be > 0")
		}
	case PatternBurst:
		if c.Burst <= 0 {
			return bad("burst", c.Burst, "must be > 0")
		}
		if c.Period <= 0 {
			return bad("period", c.Period, "must be > 0")
		}
	default:
		return bad("pattern", c.Pattern, "must be steady, burst or poisson")
	}
	return c, nil
}

// checkLoopback refuses any target that is not on this machine.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: addr: %v (got %q)", ErrInvalidConfig, err, addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w: addr %q: only 127.0.0.0/8, ::1 or localhost", ErrNotLoopback, addr)
}
