package devicelimit

import (
	"fmt"
	"strings"
)

// Class is a topic class: the messages whose topic one of Topics (MQTT
// topic filters) matches are counted under Quota in windows of their
// own per device, apart from the device's other messages (limits.go
// keys them by the class's name). A message is judged by the first
// class of a list that matches it, and by the device's quota when none
// does.
type Class struct {
	Name   string
	Topics []string
	Quota  Quota
}

// MaxClassName bounds a class's name.
const MaxClassName = 64

// ValidateClasses checks a list of classes: names of 1 to MaxClassName
// bytes without a NUL, unique; at least one valid topic filter each;
// valid quotas. The error names the place ("classes[1].topics[0]").
func ValidateClasses(cs []Class, buckets int) error {
	seen := map[string]int{}
	for i, c := range cs {
		key := fmt.Sprintf("classes[%d]", i)
		if c.Name == "" || len(c.Name) > MaxClassName || strings.ContainsRune(c.Name, 0) {
			return &FieldError{Field: key + ".name", Msg: fmt.Sprintf("must be 1 to %d bytes without NUL (got %q)", MaxClassName, c.Name), Err: ErrInvalidQuota}
		}
		if c.Name == GroupPolicy {
			return &FieldError{Field: key + ".name", Msg: fmt.Sprintf("%q names the group's windows in the RateLimit fields; choose another name", c.Name), Err: ErrInvalidQuota}
		}
		if j, dup := seen[c.Name]; dup {
			return &FieldError{Field: key + ".name", Msg: fmt.Sprintf("%q is also the name of classes[%d]", c.Name, j), Err: ErrInvalidQuota}
		}
		seen[c.Name] = i
		if len(c.Topics) == 0 {
			return &FieldError{Field: key + ".topics", Msg: "must list at least one topic filter", Err: ErrInvalidQuota}
		}
		for j, f := range c.Topics {
			if msg := ValidFilter(f); msg != "" {
				return &FieldError{Field: fmt.Sprintf("%s.topics[%d]", key, j), Msg: msg, Err: ErrInvalidQuota}
			}
		}
		if err := c.Quota.Validate(buckets); err != nil {
			if fe, ok := err.(*FieldError); ok {
				return &FieldError{Field: key + ".quota." + fe.Field, Msg: fe.Msg, Err: fe.Err}
			}
			return err
		}
	}
	return nil
}

// ValidFilter checks an MQTT topic filter: not empty, '#' only as the
// last level, '+' and '#' only as a whole level. It returns what is
// wrong, "" when nothing is.
func ValidFilter(f string) string {
	if f == "" {
		return "must not be empty"
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.ContainsAny(l, "+#") && len(l) > 1 || l == "#" && i != len(levels)-1 {
			return fmt.Sprintf("is not a valid topic filter: '+' and '#' stand for whole levels, '#' only last (got %q)", f)
		}
	}
	return ""
}

// MatchClass returns the first class of cs one of whose filters matches
// topic.
func MatchClass(cs []Class, topic string) (*Class, bool) {
	for i := range cs {
		for _, f := range cs[i].Topics {
			if MatchTopic(f, topic) {
				return &cs[i], true
			}
		}
	}
	return nil, false
}

// MatchTopic reports whether the MQTT topic filter matches topic: '+'
// matches one level, a last '#' the level before it and any below; a
// wildcard first level matches no topic starting with '$'
// (MQTT-4.7.2-1). It allocates nothing.
func MatchTopic(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(filter, "/")
		if fl == "#" {
			return true
		}
		tl, trest, tmore := strings.Cut(topic, "/")
		if fl != "+" && fl != tl {
			return false
		}
		switch {
		case !fmore && !tmore:
			return true
		case !tmore:
			return frest == "#" // "a/#" matches "a"
		case !fmore:
			return false
		}
		filter, topic = frest, trest
	}
}

// AllowClassAt decides a message of size bytes on topic class (the
// device's own quota when class is empty) under q: AllowQuotaAt, in the
// class's windows.
func (t *Table) AllowClassAt(device, class string, q Quota, size int, now Tick) Decision {
	if class == "" {
		return t.AllowQuotaAt(device, q, size, now)
	}
	if q.NWindows == 0 {
		one := [1]Limit{{Unit: Messages, N: q.Limit, Window: q.Window}}
		return t.decideAll(device, class, one[:], size, now, true, !q.Shadow).Decision()
	}
	return t.decideAll(device, class, q.Windows[:min(max(q.NWindows, 0), MaxWindows)], size, now, true, !q.Shadow).Decision()
}
