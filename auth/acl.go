package auth

import (
	"fmt"
	"strings"
)

// DeviceVar is the placeholder of the device's identity in an ACL
// topic template; it must be a whole topic level.
const DeviceVar = "{device}"

// Default ACL templates.
const (
	DefaultPublish   = "devices/{device}/#"
	DefaultSubscribe = "devices/{device}/cmd/#"
)

// ACL holds the topic templates of devices: the filter a device may
// publish under and the filter it may subscribe within, each with
// DeviceVar standing for the device. The zero value is not valid; use
// NewACL.
type ACL struct {
	publish, subscribe []string // levels
}

// NewACL checks and compiles the two templates: valid MQTT filters
// ('+' and a final '#' allowed) that contain DeviceVar as a whole level.
func NewACL(publish, subscribe string) (ACL, error) {
	p, err := compileTemplate(publish)
	if err != nil {
		return ACL{}, err
	}
	s, err := compileTemplate(subscribe)
	if err != nil {
		return ACL{}, err
	}
	return ACL{publish: p, subscribe: s}, nil
}

// CheckTemplate checks one template as NewACL does.
func CheckTemplate(t string) error {
	_, err := compileTemplate(t)
	return err
}

func compileTemplate(t string) ([]string, error) {
	levels := strings.Split(t, "/")
	has := false
	for i, l := range levels {
		switch {
		case l == DeviceVar:
			has = true
		case l == "#" && i != len(levels)-1:
			return nil, fmt.Errorf("%w: %q: '#' must be the last level", ErrInvalidTemplate, t)
		case l != "+" && l != "#" && strings.ContainsAny(l, "+#{}"):
			return nil, fmt.Errorf("%w: %q: level %q: '+' and '#' must be whole levels, and %s the only placeholder", ErrInvalidTemplate, t, l, DeviceVar)
		case strings.ContainsRune(l, 0):
			return nil, fmt.Errorf("%w: %q contains a NUL byte", ErrInvalidTemplate, t)
		}
	}
	if !has {
		return nil, fmt.Errorf("%w: %q: must contain %s as a whole level, or devices could use each other's topics", ErrInvalidTemplate, t, DeviceVar)
	}
	return levels, nil
}

// ValidDevice reports whether device can stand in a topic level: not
// empty, and without '/', '+', '#' or NUL, which would let it reach
// other devices' topics.
func ValidDevice(device string) bool {
	return device != "" && !strings.ContainsAny(device, "/+#\x00")
}

// CanPublish reports whether device may publish to topic.
func (a ACL) CanPublish(device, topic string) bool { return within(topic, a.publish, device) }

// CanSubscribe reports whether device may subscribe to filter, or
// receive a message on a topic (a filter without wildcards): every topic
// filter matches must be within the subscribe template.
func (a ACL) CanSubscribe(device, filter string) bool { return within(filter, a.subscribe, device) }

// within reports whether every topic that filter matches is matched by
// the template tmpl with device substituted. It does not allocate.
func within(filter string, tmpl []string, device string) bool {
	rest, more := filter, true
	for _, t := range tmpl {
		if t == "#" {
			return true // anything below, and the parent level itself
		}
		if !more {
			return false // filter is shorter than the template
		}
		var l string
		l, rest, more = strings.Cut(rest, "/")
		switch t {
		case "+":
			if l == "#" {
				return false
			}
		case DeviceVar:
			if l != device {
				return false
			}
		default:
			if l != t {
				return false
			}
		}
	}
	return !more // filter has no levels beyond the template
}

// IsZero reports whether a is the zero ACL, not built by NewACL.
func (a ACL) IsZero() bool { return a.publish == nil }
