package config

import (
	"fmt"
	"strconv"

	"github.com/devicegate/devicegate/devicelimit"

	"gopkg.in/yaml.v3"
)

// Size is a number of bytes, written in YAML as a whole number of bytes
// or a string with a binary unit: "512KiB", "1MiB", "256MiB", "1GiB".
type Size int64

// String formats the size with the largest unit that divides it.
func (s Size) String() string { return devicelimit.FormatSize(int64(s)) }

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

func parseSize(n *yaml.Node) (Size, string) {
	bad := fmt.Sprintf(`must be a size in bytes like 1048576 or "1MiB" (got %s)`, describe(n))
	switch {
	case n.Kind != yaml.ScalarNode:
		return 0, bad
	case n.ShortTag() == "!!str":
		v, err := devicelimit.ParseSize(n.Value)
		if err != nil {
			return 0, bad
		}
		return Size(v), ""
	case n.ShortTag() != "!!int":
		return 0, bad
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil || v < 0 || v > devicelimit.MaxSize {
		return 0, bad
	}
	return Size(v), ""
}
