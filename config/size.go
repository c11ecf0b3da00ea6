package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Size is a number of bytes, written in YAML as a whole number of bytes
// or a string with a binary unit: "512KiB", "1MiB", "256MiB", "1GiB".
type Size int64

var sizeUnits = []struct {
	suffix string
	bytes  int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// String formats the size with the largest unit that divides it.
func (s Size) String() string {
	for _, u := range sizeUnits {
		if s != 0 && int64(s)%u.bytes == 0 {
			return strconv.FormatInt(int64(s)/u.bytes, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// MarshalYAML writes the size as a string such as "256MiB".
func (s Size) MarshalYAML() (any, error) { return s.String(), nil }

// UnmarshalYAML reads a size: bytes, or a string with a unit.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	v, msg := parseSize(n)
	if msg != "" {
		return fmt.Errorf("line %d: %s", n.Line, msg)
	}
	*s = v
	return nil
}

// ParseSize reads a size with a unit, such as "5MiB", "512KiB" or
// "100B" (GiB, MiB, KiB, B).
func ParseSize(s string) (Size, error) {
	v, msg := parseSize(&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s})
	if msg != "" {
		return 0, errors.New(msg)
	}
	return v, nil
}

// maxSize keeps sizes far from overflow: 1 TiB.
const maxSize = 1 << 40

func parseSize(n *yaml.Node) (Size, string) {
	bad := fmt.Sprintf(`must be a size in bytes like 1048576 or "1MiB" (got %s)`, describe(n))
	if n.Kind != yaml.ScalarNode {
		return 0, bad
	}
	text, mult := n.Value, int64(1)
	if n.ShortTag() == "!!str" {
		mult = 0
		for _, u := range sizeUnits {
			if rest, ok := strings.CutSuffix(text, u.suffix); ok {
				text, mult = strings.TrimSpace(rest), u.bytes
				break
			}
		}
		if mult == 0 {
			return 0, bad
		}
	} else if n.ShortTag() != "!!int" {
		return 0, bad
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil || v < 0 || v > maxSize/mult {
		return 0, bad
	}
	return Size(v * mult), ""
}
