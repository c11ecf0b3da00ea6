package devicelimit

import (
	"fmt"
	"slices"
	"strings"
)

// Groups. A rule (or the default) can put its devices in a group: a
// tenant, a customer, a site. A group has windows of its own (messages
// or bytes, as a device quota), shared by all its devices and checked
// with the device's own: a message is admitted only when the device's
// windows and the group's all admit it, and is then counted in both
// (Table.AllowGroupAt). The group a device is in comes from its rule's
// template: fixed text ("acme") or parts of its identity, "{client_id}",
// "{username}", or a named part of the rule's client_id or username
// pattern ("tenant-{tenant}-*" with the template "{tenant}").
//
// A group's windows live in the table under its key, GroupKey(name): a
// NUL and the name, which no device ID can be (an MQTT string holds no
// NUL), so a group never shares a window with a device. Its override
// is an override of that key (Resolver.SetOverride), stored and shared
// like a device's.

// Group is a rule's group: the template of the group's name and the
// group's quota (its windows and Shadow; a group has no policy of its
// own, the device's applies, nor classes nor a block).
type Group struct {
	Name  string
	Quota Quota
}

// MaxGroupName bounds a group's name, after its template is filled in.
const MaxGroupName = 256

// GroupKey returns the key of the group's windows and override.
func GroupKey(name string) string { return "\x00" + name }

// GroupOfKey returns the group name of a key GroupKey made.
func GroupOfKey(key string) (string, bool) {
	if len(key) < 2 || key[0] != 0 {
		return "", false
	}
	return key[1:], true
}

// ValidGroupName checks a group's name: 1 to MaxGroupName bytes, no NUL.
func ValidGroupName(name string) error {
	if name == "" || len(name) > MaxGroupName || strings.IndexByte(name, 0) >= 0 {
		return &FieldError{Field: "group", Msg: fmt.Sprintf("must be 1 to %d bytes without NUL (got %q)", MaxGroupName, name), Err: ErrInvalidDevice}
	}
	return nil
}

// Template is a compiled group name template: text and {part}s.
type Template struct {
	source string
	segs   []tmplSeg
}

type tmplSeg struct {
	lit  string
	part int // index into the parts the template was compiled against; -1 for lit
}

// The parts every template may name, besides a pattern's named parts.
const (
	PartClientID = "client_id"
	PartUsername = "username"
)

// CompileTemplate compiles a group name template against the parts it
// may name (PartClientID, PartUsername and the rule's named pattern
// parts). A part it names that is not one of them is an error naming
// it and the known ones; so is an empty template.
func CompileTemplate(s string, parts []string) (Template, error) {
	if s == "" {
		return Template{}, fmt.Errorf("must not be empty")
	}
	t := Template{source: s}
	var lit strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '{' {
			lit.WriteByte(s[i])
			continue
		}
		name, ok := partName(s[i:])
		if !ok {
			return Template{}, fmt.Errorf("has a '{' that does not start a part {name} (got %q)", s)
		}
		k := slices.Index(parts, name)
		if k < 0 {
			return Template{}, fmt.Errorf("names the part {%s}, which is not one of %s (got %q)", name, knownParts(parts), s)
		}
		if lit.Len() > 0 {
			t.segs = append(t.segs, tmplSeg{lit: lit.String(), part: -1})
			lit.Reset()
		}
		t.segs = append(t.segs, tmplSeg{part: k})
		i += len(name) + 1
	}
	if lit.Len() > 0 {
		t.segs = append(t.segs, tmplSeg{lit: lit.String(), part: -1})
	}
	if strings.IndexByte(s, 0) >= 0 || len(s) > MaxGroupName && t.Fixed() {
		return Template{}, fmt.Errorf("must be 1 to %d bytes without NUL (got %q)", MaxGroupName, s)
	}
	return t, nil
}

func knownParts(parts []string) string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = "{" + p + "}"
	}
	return strings.Join(out, ", ")
}

// Fixed reports whether the template names no part: one group.
func (t Template) Fixed() bool {
	for _, s := range t.segs {
		if s.part >= 0 {
			return false
		}
	}
	return true
}

// String returns the template's source.
func (t Template) String() string { return t.source }

// Expand fills the template in with values (in the order of the parts
// it was compiled against). A name that comes out empty (every part it
// names empty, and no text) or too long is the template's source
// itself: such devices share one group rather than none.
func (t Template) Expand(values []string) string {
	var b strings.Builder
	for _, s := range t.segs {
		if s.part < 0 {
			b.WriteString(s.lit)
		} else if s.part < len(values) {
			b.WriteString(values[s.part])
		}
	}
	name := b.String()
	if name == "" || len(name) > MaxGroupName || strings.IndexByte(name, 0) >= 0 {
		return t.source
	}
	return name
}

// ValidateGroupQuota checks a group's quota: valid windows, and nothing
// a group does not have (a policy other than the zero value is ignored,
// classes and blocks are refused by the callers that can hold them).
func ValidateGroupQuota(q Quota, buckets int) error {
	if q.Block != (Block{}) {
		return &FieldError{Field: "block", Msg: "a group has no block: blocking is per device", Err: ErrInvalidQuota}
	}
	q.Policy = PolicyDrop
	return q.Validate(buckets)
}

// CouldMake reports whether the template can expand to name for some
// values of its parts (a part may stand for any text): whether a group
// named name can exist under it.
func (t Template) CouldMake(name string) bool { return t.couldMake(t.segs, name) }

func (t Template) couldMake(segs []tmplSeg, name string) bool {
	if len(segs) == 0 {
		return name == ""
	}
	if s := segs[0]; s.part < 0 {
		return strings.HasPrefix(name, s.lit) && t.couldMake(segs[1:], name[len(s.lit):])
	}
	for i := 0; i <= len(name); i++ { // the part takes name[:i]
		if t.couldMake(segs[1:], name[i:]) {
			return true
		}
	}
	return false
}
