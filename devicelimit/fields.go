package devicelimit

import (
	"strconv"
	"time"
)

// The RateLimit-Policy and RateLimit fields (the IETF RateLimit header
// fields, draft-ietf-httpapi-ratelimit-headers-10, as Structured Field
// lists, RFC 9651) that MQTT 5 CONNACK, PUBACK and PUBREC carry as user
// properties; docs/device-feedback.md gives their syntax and meaning.
// Every Append function appends to the caller's buffer and allocates
// nothing when it is large enough.

// The user property names.
const (
	PolicyProperty    = "RateLimit-Policy"
	RateLimitProperty = "RateLimit"
	// ReleasedProperty is the user property a deferred message carries
	// to MQTT 5 subscribers once released: the instant the gateway
	// admitted it, RFC 3339 with nanoseconds, UTC
	// (docs/limits.md, "Deferred messages").
	ReleasedProperty = "devicegate-released-at"
)

// GroupPolicy is the first part of a group window's policy name,
// "group/1m": no topic class may be named so.
const GroupPolicy = "group"

// AppendPolicyName appends the policy name of window l of class (""
// for the device's own quota), or of the device's group: the window's
// length in short form ("10s", "1m", "1h30m"), "-bytes" after it for a
// byte window, "CLASS/" or "group/" before it. It is not quoted.
func AppendPolicyName(b []byte, class string, group bool, l Limit) []byte {
	switch {
	case group:
		b = append(b, GroupPolicy+"/"...)
	case class != "":
		b = append(b, class...)
		b = append(b, '/')
	}
	b = AppendShortDuration(b, l.Window)
	if l.Unit == Bytes {
		b = append(b, "-bytes"...)
	}
	return b
}

// AppendShortDuration appends d as time.Duration.String does, less the
// zero units it ends with: "1m", not "1m0s"; "24h", not "24h0m0s";
// "1h30m"; "1.5s" and "250ms" as they are.
func AppendShortDuration(b []byte, d time.Duration) []byte {
	var buf [32]byte
	w := len(buf)
	u := uint64(d)
	if d < 0 {
		u = -u
	}
	if u < uint64(time.Second) {
		prec := 6 // milliseconds
		unit := "ms"
		switch {
		case u == 0:
			return append(b, "0s"...)
		case u < uint64(time.Microsecond):
			prec, unit = 0, "ns"
		case u < uint64(time.Millisecond):
			prec, unit = 3, "us"
		}
		w -= len(unit)
		copy(buf[w:], unit)
		w, u = fmtFrac(buf[:w], u, prec)
		w = fmtInt(buf[:w], u)
	} else {
		frac := u % uint64(time.Second)
		secs := u / uint64(time.Second)
		trimS := frac == 0 && secs%60 == 0 && secs >= 60
		if !trimS {
			w--
			buf[w] = 's'
			w, u = fmtFrac(buf[:w], u, 9)
			w = fmtInt(buf[:w], u%60)
		} else {
			u /= uint64(time.Second)
		}
		u /= 60
		if u > 0 {
			trimM := trimS && u%60 == 0 && u >= 60
			if !trimM {
				w--
				buf[w] = 'm'
				w = fmtInt(buf[:w], u%60)
			}
			u /= 60
			if u > 0 {
				w--
				buf[w] = 'h'
				w = fmtInt(buf[:w], u)
			}
		}
	}
	if d < 0 {
		w--
		buf[w] = '-'
	}
	return append(b, buf[w:]...)
}

// fmtFrac writes the fraction of v/10**prec into the tail of buf,
// without trailing zeros and without the dot when it is 0; it returns
// where the output starts and v/10**prec (time's own helper).
func fmtFrac(buf []byte, v uint64, prec int) (int, uint64) {
	w := len(buf)
	print := false
	for range prec {
		digit := v % 10
		print = print || digit != 0
		if print {
			w--
			buf[w] = byte(digit) + '0'
		}
		v /= 10
	}
	if print {
		w--
		buf[w] = '.'
	}
	return w, v
}

// fmtInt writes v into the tail of buf and returns where it starts.
func fmtInt(buf []byte, v uint64) int {
	w := len(buf)
	if v == 0 {
		w--
		buf[w] = '0'
		return w
	}
	for v > 0 {
		w--
		buf[w] = byte(v%10) + '0'
		v /= 10
	}
	return w
}

// appendSFName appends a Structured Field string holding the policy
// name of l (see AppendPolicyName): quoted, '"' and '\' escaped, and a
// byte an SF string cannot hold (outside 0x20-0x7E) and '%' as %XX.
func appendSFName(b []byte, class string, group bool, l Limit) []byte {
	b = append(b, '"')
	start := len(b)
	b = AppendPolicyName(b, class, group, l)
	// The name is escaped in place, from its end: most names need none.
	extra := 0
	for _, c := range b[start:] {
		switch {
		case c == '"' || c == '\\':
			extra++
		case c < 0x20 || c > 0x7e || c == '%':
			extra += 2
		}
	}
	if extra > 0 {
		n := len(b)
		for range extra {
			b = append(b, 0)
		}
		w := len(b)
		for i := n - 1; i >= start; i-- {
			c := b[i]
			switch {
			case c == '"' || c == '\\':
				w -= 2
				b[w], b[w+1] = '\\', c
			case c < 0x20 || c > 0x7e || c == '%':
				w -= 3
				b[w], b[w+1], b[w+2] = '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15]
			default:
				w--
				b[w] = c
			}
		}
	}
	return append(b, '"')
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// appendPolicyItem appends one RateLimit-Policy item: the window's name,
// q, w (whole seconds, rounded up), qu for a byte window, shadow.
func appendPolicyItem(b []byte, class string, group, shadow bool, l Limit) []byte {
	b = appendSFName(b, class, group, l)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, int64(l.N), 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, ceilSeconds(l.Window), 10)
	if l.Unit == Bytes {
		b = append(b, `;qu="content-bytes"`...)
	}
	if shadow {
		b = append(b, ";shadow"...)
	}
	return b
}

// AppendPolicy appends the RateLimit-Policy field of a device under q
// with topic classes: an SF list of q's windows, then each class's,
// then, when gq is not nil, its group's; each item with ";shadow" when
// its quota is in shadow mode.
//
//	"10s";q=100;w=10, "10s-bytes";q=65536;w=10;qu="content-bytes", "telemetry/1m";q=30;w=60, "group/1m";q=1000;w=60
func AppendPolicy(b []byte, q Quota, classes []Class, gq *Quota) []byte {
	start := len(b)
	items := func(b []byte, class string, group bool, q *Quota) []byte {
		var one [1]Limit
		for _, l := range limitsInto(*q, &one) {
			if len(b) > start {
				b = append(b, ", "...)
			}
			b = appendPolicyItem(b, class, group, q.Shadow, l)
		}
		return b
	}
	b = items(b, "", false, &q)
	for i := range classes {
		b = items(b, classes[i].Name, false, &classes[i].Quota)
	}
	if gq != nil {
		b = items(b, "", true, gq)
	}
	return b
}

// AppendRateLimit appends the RateLimit field of s: an SF list of its
// windows in s's order (StandingAt's: tightest first), each with r, t
// (whole seconds, rounded up) and ";shadow" in shadow mode.
//
//	"10s";r=42;t=7, "group/1m";r=900;t=31
func (s *Standing) AppendRateLimit(b []byte) []byte {
	for i, w := range s.Windows[:s.N] {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendSFName(b, w.Class, w.Group, w.Limit)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, int64(w.Remaining), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, ceilSeconds(w.Reset), 10)
		if w.Shadow {
			b = append(b, ";shadow"...)
		}
	}
	return b
}
