package devicelimit

import (
	"fmt"
	"slices"
	"strings"
)

// Glob is a compiled pattern over client IDs or usernames: '*' matches any
// run of bytes, '?' any one byte, '\' escapes the next byte, and a
// named part "{name}" (a letter or '_', then letters, digits or '_')
// matches like '*' and keeps what it matched under its name (Capture;
// a rule's group template names it, group.go). Unlike path.Match, '/'
// is not special. The zero value matches only "".
type Glob struct {
	pattern string
	parts   []globPart
	names   []string // the named parts, in order
}

type globPart struct {
	lit  string // literal bytes to match
	any  int    // number of '?' before lit
	star bool   // a '*' before lit (and before the '?'s)
	cap  int    // the named part the star is, an index of names; -1 for none
}

// CompileGlob compiles pattern; an empty pattern or a trailing '\' is an
// error.
func CompileGlob(pattern string) (Glob, error) {
	if pattern == "" {
		return Glob{}, fmt.Errorf("%w: empty", ErrInvalidPattern)
	}
	g := Glob{pattern: pattern}
	cur := globPart{cap: -1}
	var lit strings.Builder
	flush := func() {
		cur.lit = lit.String()
		g.parts = append(g.parts, cur)
		cur = globPart{cap: -1}
		lit.Reset()
	}
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		if name, ok := partName(pattern[i:]); ok {
			if slices.Contains(g.names, name) {
				return Glob{}, fmt.Errorf("%w: the part {%s} is named twice in %q", ErrInvalidPattern, name, pattern)
			}
			if lit.Len() > 0 || cur.star {
				flush()
			}
			cur.star, cur.cap = true, len(g.names)
			g.names = append(g.names, name)
			i += len(name) + 1
			continue
		}
		switch c {
		case '*', '?':
			if lit.Len() > 0 {
				flush()
			}
			if c == '*' {
				cur.star = true
			} else {
				cur.any++
			}
		case '\\':
			if i+1 == len(pattern) {
				return Glob{}, fmt.Errorf("%w: trailing backslash in %q", ErrInvalidPattern, pattern)
			}
			i++
			lit.WriteByte(pattern[i])
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return g, nil
}

// partName returns the name of the named part "{name}" s starts with.
func partName(s string) (string, bool) {
	if len(s) < 3 || s[0] != '{' {
		return "", false
	}
	end := strings.IndexByte(s, '}')
	if end < 2 {
		return "", false
	}
	name := s[1:end]
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return "", false
		}
	}
	return name, true
}

// String returns the source pattern.
func (g Glob) String() string { return g.pattern }

// Names returns the pattern's named parts, in order.
func (g Glob) Names() []string { return g.names }

// Capture matches s like Match and returns what each named part matched
// (in the order of Names): the leftmost match, each part as short as
// the ones before it allow.
func (g Glob) Capture(s string) ([]string, bool) {
	caps := make([]string, len(g.names))
	if !matchParts(g.parts, s, caps) {
		return nil, false
	}
	return caps, true
}

// matchParts reports whether s matches parts, keeping what each named
// part matched in caps when caps is not nil. A star tries every position
// of the literal after it, leftmost first; the last part must end the
// string.
func matchParts(parts []globPart, s string, caps []string) bool {
	for i, p := range parts {
		if len(s) < p.any {
			return false
		}
		if !p.star {
			s = s[p.any:]
			if !strings.HasPrefix(s, p.lit) {
				return false
			}
			s = s[len(p.lit):]
			continue
		}
		rest := s[p.any:]
		if i == len(parts)-1 {
			if !strings.HasSuffix(rest, p.lit) {
				return false
			}
			if p.cap >= 0 && caps != nil {
				caps[p.cap] = s[:len(s)-len(p.lit)-p.any]
			}
			return true
		}
		for off := 0; off <= len(rest); {
			j := strings.Index(rest[off:], p.lit)
			if j < 0 {
				return false
			}
			if matchParts(parts[i+1:], rest[off+j+len(p.lit):], caps) {
				if p.cap >= 0 && caps != nil {
					caps[p.cap] = s[:off+j]
				}
				return true
			}
			off += j + 1
		}
		return false
	}
	return s == ""
}

// Match reports whether s matches the whole pattern.
func (g Glob) Match(s string) bool { return matchParts(g.parts, s, nil) }
