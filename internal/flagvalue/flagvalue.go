// Package flagvalue holds the flag.Value types the commands share
// (cmd/gateway and package fleet's simulate flags): an int and a
// duration whose parse errors read like the config's.
package flagvalue

import (
	"errors"
	"strconv"
	"time"
)

// Int is an int flag whose parse errors read like the config's.
type Int struct{ V int }

func (i *Int) String() string { return strconv.Itoa(i.V) }

// Set parses s as a decimal integer.
func (i *Int) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("must be an integer")
	}
	i.V = v
	return nil
}

// Duration is a duration flag that asks for a unit.
type Duration struct{ V time.Duration }

func (d *Duration) String() string { return d.V.String() }

// Set parses s as a time.Duration ("10s").
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New(`must be a duration like "10s"`)
	}
	d.V = v
	return nil
}
