package simulator

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The gateway's feedback to MQTT 5 devices (docs/device-feedback.md):
// the user property RateLimit-Policy on CONNACK (and on an
// acknowledgement after the quota changed), and RateLimit on PUBACK and
// PUBREC. Both are Structured Field lists (RFC 9651) of strings with
// parameters, after the IETF draft RateLimit header fields for HTTP.
const (
	PropRateLimitPolicy = "RateLimit-Policy"
	PropRateLimit       = "RateLimit"
)

// RatePolicy is one item of RateLimit-Policy: a window of the device's
// quota.
type RatePolicy struct {
	// Name is the window's name: "10s", "10s-bytes", "telemetry/1m",
	// "group/1m".
	Name string `json:"name"`
	// Quota is q: messages, or payload bytes when Bytes.
	Quota int64 `json:"q"`
	// Window is w, whole seconds.
	Window time.Duration `json:"w_ns"`
	// Bytes is qu="content-bytes": the window counts payload bytes.
	Bytes bool `json:"bytes,omitempty"`
	// Shadow is set when the device's quota is in shadow mode: the
	// window is what the gateway would enforce.
	Shadow bool `json:"shadow,omitempty"`
}

// RateRemaining is one item of RateLimit: where the device stands in a
// window that bounds the message acknowledged.
type RateRemaining struct {
	Name string `json:"name"`
	// R is how many more messages (bytes, for a byte window) the window
	// admits now.
	R int64 `json:"r"`
	// T is, when refused, the retry-after; when admitted, the time
	// until the window next frees room; 0 when R is the full quota.
	// Whole seconds, rounded up by the gateway.
	T time.Duration `json:"t_ns"`
	// Shadow: R and T are what the enforcing quota would leave.
	Shadow bool `json:"shadow,omitempty"`
}

// ErrBadField is wrapped by the errors of ParseRatePolicies and
// ParseRateRemaining.
var ErrBadField = errors.New("bad structured field")

// ParseRatePolicies parses a RateLimit-Policy value. Unknown parameters
// are ignored, as the draft asks of recipients; a missing q or w, or a
// unit other than "requests" and "content-bytes", is an error.
func ParseRatePolicies(s string) ([]RatePolicy, error) {
	items, err := parseField(PropRateLimitPolicy, s)
	if err != nil {
		return nil, err
	}
	out := make([]RatePolicy, 0, len(items))
	for _, it := range items {
		p := RatePolicy{Name: it.value}
		var hasQ, hasW bool
		for _, pm := range it.params {
			switch pm.key {
			case "q":
				p.Quota, hasQ = pm.num, pm.kind == sfInteger && pm.num >= 0
			case "w":
				p.Window, hasW = time.Duration(pm.num)*time.Second, pm.kind == sfInteger && pm.num > 0
			case "qu":
				switch {
				case pm.kind == sfString && pm.str == "content-bytes":
					p.Bytes = true
				case pm.kind == sfString && pm.str == "requests":
				default:
					return nil, fmt.Errorf("%w: %s item %q: qu=%s: want \"requests\" or \"content-bytes\"", ErrBadField, PropRateLimitPolicy, it.value, pm.raw)
				}
			case "shadow":
				p.Shadow = pm.kind == sfBoolean && pm.num == 1
			}
		}
		if !hasQ || !hasW {
			return nil, fmt.Errorf("%w: %s item %q: want an integer q >= 0 and w > 0", ErrBadField, PropRateLimitPolicy, it.value)
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseRateRemaining parses a RateLimit value; a missing or negative r
// or t is an error.
func ParseRateRemaining(s string) ([]RateRemaining, error) {
	items, err := parseField(PropRateLimit, s)
	if err != nil {
		return nil, err
	}
	out := make([]RateRemaining, 0, len(items))
	for _, it := range items {
		r := RateRemaining{Name: it.value}
		var hasR, hasT bool
		for _, pm := range it.params {
			switch pm.key {
			case "r":
				r.R, hasR = pm.num, pm.kind == sfInteger && pm.num >= 0
			case "t":
				r.T, hasT = time.Duration(pm.num)*time.Second, pm.kind == sfInteger && pm.num >= 0
			case "shadow":
				r.Shadow = pm.kind == sfBoolean && pm.num == 1
			}
		}
		if !hasR || !hasT {
			return nil, fmt.Errorf("%w: %s item %q: want integers r >= 0 and t >= 0", ErrBadField, PropRateLimit, it.value)
		}
		out = append(out, r)
	}
	return out, nil
}

// parseField parses the list s of the field name, its error naming both.
func parseField(name, s string) ([]sfItem, error) {
	items, err := parseSFList(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %q: %v", ErrBadField, name, s, err)
	}
	return items, nil
}

// sfItem is a list member: a bare item (a string or a token, as text)
// and its parameters.
type sfItem struct {
	value  string
	params []sfParam
}

type sfKind uint8

const (
	sfBoolean sfKind = iota
	sfInteger
	sfString
	sfToken
)

// sfParam is a parameter: an integer or boolean (num), a string or token
// (str); raw is its text as written.
type sfParam struct {
	key  string
	kind sfKind
	num  int64
	str  string
	raw  string
}

// parseSFList parses the subset of RFC 9651 lists the feedback uses:
// members are strings or tokens (no inner lists), parameter values
// integers, strings, tokens or booleans (no decimals, byte sequences,
// dates).
func parseSFList(s string) ([]sfItem, error) {
	p := sfParser{s: strings.Trim(s, " ")} // RFC 9651 4.2: leading and trailing SP are discarded
	var out []sfItem
	for {
		if p.done() {
			if len(out) == 0 {
				return nil, errors.New("empty list")
			}
			return out, nil
		}
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.skipOWS()
		if p.done() {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' between members, got %q", p.i, p.s[p.i])
		}
		p.i++
		p.skipOWS()
		if p.done() {
			return nil, errors.New("trailing comma")
		}
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	var it sfItem
	switch c := p.s[p.i]; {
	case c == '"':
		v, err := p.str()
		if err != nil {
			return it, err
		}
		it.value = v
	case isAlpha(c) || c == '*':
		it.value = p.token()
	default:
		return it, fmt.Errorf("at %d: want a string or a token, got %q", p.i, c)
	}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		for p.i < len(p.s) && p.s[p.i] == ' ' {
			p.i++
		}
		pm, err := p.param()
		if err != nil {
			return it, err
		}
		it.params = append(it.params, pm)
	}
	return it, nil
}

func (p *sfParser) param() (sfParam, error) {
	start := p.i
	if p.i >= len(p.s) || !(isLower(p.s[p.i]) || p.s[p.i] == '*') {
		return sfParam{}, fmt.Errorf("at %d: want a parameter key", p.i)
	}
	for p.i < len(p.s) && (isLower(p.s[p.i]) || isDigit(p.s[p.i]) || strings.IndexByte("_-.*", p.s[p.i]) >= 0) {
		p.i++
	}
	pm := sfParam{key: p.s[start:p.i], kind: sfBoolean, num: 1, raw: "?1"}
	if p.i >= len(p.s) || p.s[p.i] != '=' {
		return pm, nil // a bare key is true
	}
	p.i++
	vstart := p.i
	if p.i >= len(p.s) {
		return pm, fmt.Errorf("parameter %s: no value", pm.key)
	}
	switch c := p.s[p.i]; {
	case c == '"':
		v, err := p.str()
		if err != nil {
			return pm, err
		}
		pm.kind, pm.str = sfString, v
	case c == '?':
		if p.i+1 >= len(p.s) || (p.s[p.i+1] != '0' && p.s[p.i+1] != '1') {
			return pm, fmt.Errorf("parameter %s: bad boolean", pm.key)
		}
		pm.kind, pm.num = sfBoolean, int64(p.s[p.i+1]-'0')
		p.i += 2
	case c == '-' || isDigit(c):
		j := p.i
		if c == '-' {
			j++
		}
		k := j
		for k < len(p.s) && isDigit(p.s[k]) {
			k++
		}
		if k == j || k-j > 15 || (k < len(p.s) && p.s[k] == '.') {
			return pm, fmt.Errorf("parameter %s: want an integer of 1 to 15 digits", pm.key)
		}
		n, _ := strconv.ParseInt(p.s[p.i:k], 10, 64)
		pm.kind, pm.num = sfInteger, n
		p.i = k
	case isAlpha(c) || c == '*':
		pm.kind, pm.str = sfToken, p.token()
	default:
		return pm, fmt.Errorf("parameter %s: unsupported value at %d", pm.key, p.i)
	}
	pm.raw = p.s[vstart:p.i]
	return pm, nil
}

// str reads an sf-string at p.i, which is '"'.
func (p *sfParser) str() (string, error) {
	var b strings.Builder
	for p.i++; p.i < len(p.s); p.i++ {
		switch c := p.s[p.i]; {
		case c == '\\':
			p.i++
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", errors.New("bad escape in a string")
			}
			b.WriteByte(p.s[p.i])
		case c == '"':
			p.i++
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte 0x%02x in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("unterminated string")
}

// token reads an sf-token at p.i.
func (p *sfParser) token() string {
	start := p.i
	for p.i < len(p.s) && isTChar(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isTChar is RFC 9110's tchar plus ':' and '/', the characters of an
// sf-token after its first.
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
