package devicelimit

import (
	"fmt"
	"strings"
)

// Glob is a compiled pattern over client IDs or usernames: '*' matches any
// run of bytes, '?' any one byte, '\' escapes the next byte. Unlike
// path.Match, '/' is not special. The zero value matches only "".
type Glob struct {
	pattern string
	parts   []globPart
}

type globPart struct {
	lit  string // literal bytes to match
	any  int    // number of '?' before lit
	star bool   // a '*' before lit (and before the '?'s)
}

// CompileGlob compiles pattern; an empty pattern or a trailing '\' is an
// error.
func CompileGlob(pattern string) (Glob, error) {
	if pattern == "" {
		return Glob{}, fmt.Errorf("%w: empty", ErrInvalidPattern)
	}
	g := Glob{pattern: pattern}
	var cur globPart
	var lit strings.Builder
	flush := func() {
		cur.lit = lit.String()
		g.parts = append(g.parts, cur)
		cur = globPart{}
		lit.Reset()
	}
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
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

// String returns the source pattern.
func (g Glob) String() string { return g.pattern }

// Match reports whether s matches the whole pattern.
func (g Glob) Match(s string) bool { return matchParts(g.parts, s) }

func matchParts(parts []globPart, s string) bool {
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
		// A star: try every position of the literal, leftmost first;
		// the last part must end the string.
		s = s[p.any:]
		if i == len(parts)-1 {
			return strings.HasSuffix(s, p.lit)
		}
		for off := 0; off <= len(s); {
			j := strings.Index(s[off:], p.lit)
			if j < 0 {
				return false
			}
			if matchParts(parts[i+1:], s[off+j+len(p.lit):]) {
				return true
			}
			off += j + 1
		}
		return false
	}
	return s == ""
}
