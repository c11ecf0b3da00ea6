package simulator

import (
	"fmt"
	"math"
	"strings"

	"github.com/devicegate/devicegate/devicelimit"
)

// Class is one part of a fleet with its own quota: Share percent of the
// devices are expected to get Quota.
type Class struct {
	// Share is the percentage of the fleet in this class, > 0; the
	// shares of a mix add up to 100.
	Share float64 `json:"share"`
	// Quota is what the gateway enforces on devices of this class.
	Quota devicelimit.Quota `json:"quota"`
}

// ParseMix parses a quota mix: comma-separated classes
// "SHARE%:WINDOWS[:POLICY]", for example
// "70%:50/10s:drop,30%:5/1s:defer"; WINDOWS is one LIMIT/WINDOW or
// several joined by '+', a limit with a size unit counting bytes
// ("30%:10/1m+5KiB/1h"). Shares are percentages that add up to 100; a
// class without a policy takes def. The empty string is no mix (nil).
// Errors name the class and what is wrong with it.
func ParseMix(s string, def devicelimit.Policy) ([]Class, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []Class
	total := 0.0
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		bad := func(why string) ([]Class, error) {
			return nil, fmt.Errorf("class %d %q: %s (want SHARE%%:LIMIT/WINDOW[:POLICY], like 30%%:5/1s:defer)", i+1, part, why)
		}
		fields := strings.Split(part, ":")
		if len(fields) < 2 || len(fields) > 3 {
			return bad("want 2 or 3 fields separated by ':'")
		}
		if !strings.HasSuffix(fields[0], "%") {
			return bad("the share must end in %")
		}
		share, ok := parseShare(fields[0])
		if !ok {
			return bad("the share must be a number in (0, 100]")
		}
		ls, err := devicelimit.ParseLimits(fields[1], "+")
		if err != nil {
			return bad("the quota: " + err.Error())
		}
		for _, l := range ls {
			if l.Window <= 0 {
				return bad("the window must be a duration > 0 like 10s")
			}
		}
		if len(ls) > devicelimit.MaxWindows {
			return bad(fmt.Sprintf("at most %d windows", devicelimit.MaxWindows))
		}
		policy := def
		if len(fields) == 3 {
			if policy, err = devicelimit.ParsePolicy(fields[2]); err != nil {
				return bad("the policy must be drop, defer or disconnect")
			}
		}
		total += share
		q := devicelimit.Quota{Limit: ls[0].N, Window: ls[0].Window, Policy: policy}
		if len(ls) > 1 || ls[0].Unit == devicelimit.Bytes {
			q = devicelimit.WithWindows(policy, ls...)
		}
		out = append(out, Class{Share: share, Quota: q})
	}
	if math.Abs(total-100) > 1e-6 {
		return nil, fmt.Errorf("the shares add up to %g%%, want 100%%", total)
	}
	return out, nil
}

// FormatMix is the inverse of ParseMix.
func FormatMix(mix []Class) string {
	parts := make([]string, len(mix))
	for i, c := range mix {
		parts[i] = fmt.Sprintf("%g%%:%s:%s", c.Share, devicelimit.FormatLimits(c.Quota.Limits(), "+"), c.Quota.Policy)
	}
	return strings.Join(parts, ",")
}

// ClassOf returns the index in c.Mix of device i's class, or -1 when
// there is no mix. Classes take contiguous ranges of device numbers in
// their order: with "70%:...,30%:..." over 10 devices, devices 0-6 are
// in the first class and 7-9 in the second.
func (c Config) ClassOf(i int) int {
	if len(c.Mix) == 0 {
		return -1
	}
	return shareIndex(i, c.Devices, func(k int) float64 { return c.Mix[k].Share }, len(c.Mix))
}

// QuotaOf returns the quota device i is judged against: its class's
// under a mix, else c.Quota.
func (c Config) QuotaOf(i int) devicelimit.Quota {
	if k := c.ClassOf(i); k >= 0 {
		return c.Mix[k].Quota
	}
	return c.Quota
}

// DeviceID returns device i's client ID.
func (c Config) DeviceID(i int) string { return fmt.Sprintf(c.IDPattern, i) }
