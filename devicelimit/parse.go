package devicelimit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// sizeUnits are the binary units a size may be written in.
var sizeUnits = []struct {
	suffix string
	bytes  int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// MaxSize bounds a parsed size, far from overflow: 1 TiB.
const MaxSize = 1 << 40

// ParseSize reads a size with a binary unit: "5MiB", "512KiB", "100B",
// "1GiB"; at most MaxSize. The error says what a size looks like.
func ParseSize(s string) (int64, error) {
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil || v < 0 || v > MaxSize/u.bytes {
				break
			}
			return v * u.bytes, nil
		}
	}
	return 0, fmt.Errorf("%q is not a size with a unit such as 5MiB, 512KiB or 100B", s)
}

// FormatSize writes n bytes with the largest unit that divides it.
func FormatSize(n int64) string {
	for _, u := range sizeUnits {
		if n != 0 && n%u.bytes == 0 {
			return strconv.FormatInt(n/u.bytes, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// ParseLimits reads windows written N/DURATION (N messages) or
// SIZE/DURATION (bytes, SIZE with a unit: 5MiB/24h), separated by sep:
// "10/1m,5MiB/24h" with sep ",". It checks the form, not the bounds
// (ValidateLimits does). The error names the window.
func ParseLimits(s, sep string) ([]Limit, error) {
	var out []Limit
	for _, item := range strings.Split(s, sep) {
		item = strings.TrimSpace(item)
		count, dur, ok := strings.Cut(item, "/")
		if !ok {
			return nil, fmt.Errorf("%q is not N/DURATION or SIZE/DURATION", item)
		}
		d, err := time.ParseDuration(dur)
		if err != nil {
			return nil, fmt.Errorf("%q: %q is not a duration such as 1m", item, dur)
		}
		l := Limit{Window: d}
		if n, err := strconv.Atoi(count); err == nil {
			l.N = n
		} else if size, err := ParseSize(count); err == nil {
			l.Unit, l.N = Bytes, int(size)
		} else {
			return nil, fmt.Errorf("%q: %q is neither a message count nor a size with a unit such as 5MiB", item, count)
		}
		if l.N < 1 {
			return nil, fmt.Errorf("%q: the count must be at least 1", item)
		}
		out = append(out, l)
	}
	return out, nil
}

// FormatLimits is the inverse of ParseLimits.
func FormatLimits(ls []Limit, sep string) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		n := strconv.Itoa(l.N)
		if l.Unit == Bytes {
			n = FormatSize(int64(l.N))
		}
		parts[i] = n + "/" + shortDuration(l.Window)
	}
	return strings.Join(parts, sep)
}

// shortDuration writes d without zero parts: "1m", "24h", "1h30m".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
