package config

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
)

// Reloadable lists the keys a reload changes in a running gateway
// (SIGHUP, POST /api/v1/reload, gateway reload): a key is reloadable
// when it is one of these or under one ("limits.rules" covers
// limits.rules[0].quota.limit); "[]" stands for any item of a list
// ("forward[].rate" covers forward[2].rate, not forward[2] itself: an
// entry added or removed needs a restart). A change to any other key
// refuses the reload as a whole (ReloadChanges). The configuration
// reference's Reload column says the same (TestReloadColumn).
var Reloadable = []string{
	"limits.default",
	"limits.rules",
	"limits.classes",
	"limits.group",
	"log.level",
	"mqtt.tls.cert_file",
	"mqtt.tls.key_file",
	"mqtt.consumers",
	"mqtt.connect_rate",
	"mqtt.max_pending_connections",
	"mqtt.max_pending_per_address",
	"auth.acl",
	"forward[].rate",
	"forward[].max_age",
	"forward[].max_bytes",
	"forward[].username",
	"forward[].password",
	"forward[].password_file",
	"forward[].password_env",
	"forward[].creds_file",
	"forward[].sasl",
	"forward[].tls.cert_file",
	"forward[].tls.key_file",
}

// IsReloadable reports whether a reload may change key, a full key such
// as "limits.rules[0].quota.limit" or "forward[1].rate" (or a key of
// the reference, "limits.rules[].quota.limit").
func IsReloadable(key string) bool {
	key = anyItem(key)
	for _, r := range Reloadable {
		if key == r || strings.HasPrefix(key, r+".") || strings.HasPrefix(key, r+"[") {
			return true
		}
	}
	return false
}

// anyItem returns key with every list index made "[]":
// "forward[1].tls.cert_file" is "forward[].tls.cert_file".
func anyItem(key string) string {
	if !strings.Contains(key, "[") {
		return key
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		b.WriteByte(key[i])
		if key[i] == '[' {
			for i+1 < len(key) && key[i+1] >= '0' && key[i+1] <= '9' {
				i++
			}
		}
	}
	return b.String()
}

// Change is one key whose value a reload would change; Old or New is
// "(none)" when the key is absent on that side (a list grew or shrank,
// an optional block appeared). A list item's own value is "(item)", or
// "(item name=NAME)" for an item with a name (a rule, a forward entry,
// a group), so an added rule reads `limits.rules[1]: "(none)" ->
// "(item name=meters)"`.
type Change struct {
	Key      string
	Old, New string
}

func (c Change) String() string { return fmt.Sprintf("%s: %q -> %q", c.Key, c.Old, c.New) }

// ReloadChanges compares the running configuration with a new one: the
// changes, in key order, and an error naming every changed key that
// cannot be reloaded with its old and new values (then nothing may be
// applied). Both configurations must be valid. The values of secrets
// (a token, a password) are not shown: "(secret)".
func ReloadChanges(running, next Config) ([]Change, error) {
	a, b := Flatten(running), Flatten(next)
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var changes []Change
	var refused []error
	for _, k := range keys {
		if a[k] == b[k] || inMissingItem(k, a) || inMissingItem(k, b) || isItem(a[k]) && isItem(b[k]) {
			continue // a list item on both sides: its keys say what changed
		}
		c := Change{Key: k, Old: valueOrNone(a, k), New: valueOrNone(b, k)}
		if secret(k) {
			c.Old, c.New = "(secret)", "(secret)"
		}
		changes = append(changes, c)
		if !IsReloadable(k) {
			refused = append(refused, &FieldError{Key: k, Msg: fmt.Sprintf("cannot change without a restart (running %q, file %q)", c.Old, c.New)})
		}
	}
	if len(refused) > 0 {
		return changes, errors.Join(refused...)
	}
	return changes, nil
}

// Flatten returns every key of c with its value as text: "mqtt.tcp",
// "limits.rules[0].quota.limit", "forward[1].rate"... Each item of a
// list is also listed under its own key ("forward[1]"), so that an item
// added or removed is one change, not one per key in it.
func Flatten(c Config) map[string]string {
	out := make(map[string]string)
	flatten(reflect.ValueOf(c), "", out)
	return out
}

var (
	stringerType = reflect.TypeFor[fmt.Stringer]()
	levelType    = reflect.TypeFor[slog.Level]()
)

func flatten(v reflect.Value, key string, out map[string]string) {
	if v.Type() == levelType {
		out[key] = LevelName(slog.Level(v.Int()))
		return
	}
	if v.Kind() != reflect.Struct && v.Kind() != reflect.Slice && v.Kind() != reflect.Pointer && v.Type().Implements(stringerType) {
		out[key] = v.Interface().(fmt.Stringer).String()
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			flatten(v.Elem(), key, out)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			flatten(v.Field(i), join(key, name), out)
		}
	case reflect.Slice:
		for i := range v.Len() {
			item := fmt.Sprintf("%s[%d]", key, i)
			out[item] = itemLabel(v.Index(i)) // a scalar item's value replaces it
			flatten(v.Index(i), item, out)
		}
	default:
		out[key] = fmt.Sprint(v.Interface())
	}
}

// valueOrNone returns side's value of key, or "(none)" when side lacks
// the key.
func valueOrNone(side map[string]string, key string) string {
	if v, ok := side[key]; ok {
		return v
	}
	return "(none)"
}

// isItem reports whether v is a list item's value from itemLabel.
func isItem(v string) bool { return strings.HasPrefix(v, "(item") }

// itemLabel is a list item's value in a change: "(item name=NAME)" for
// a struct with a non-empty name field, else "(item)".
func itemLabel(v reflect.Value) string {
	for v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		t := v.Type()
		for i := range t.NumField() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			if f := v.Field(i); name == "name" && f.Kind() == reflect.String && f.String() != "" {
				return "(item name=" + f.String() + ")"
			}
		}
	}
	return "(item)"
}

// secret reports whether key holds a secret.
func secret(key string) bool {
	return strings.HasSuffix(key, ".token") || strings.HasSuffix(key, ".password")
}

// inMissingItem reports whether key is under a list item that side does
// not have ("forward[0].to" when side has no "forward[0]"): the item's
// own change says it.
func inMissingItem(key string, side map[string]string) bool {
	if _, ok := side[key]; ok {
		return false
	}
	for i := range len(key) - 1 {
		if key[i] == ']' {
			if _, ok := side[key[:i+1]]; !ok {
				return true
			}
		}
	}
	return false
}
