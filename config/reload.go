package config

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
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
// "(item name=NAME)" for an item with a name (a forward entry, a rule,
// a topic class). The items of the lists in NamedLists (rules, topic
// classes) are compared by name, not by place, and keyed by it: a rule
// added reads `limits.rules[meters]: "(none)" -> "(item name=meters)"`,
// removed from the middle of the list it is that one change, and a
// change inside it reads `limits.rules[meters].quota.limit: "5" ->
// "3"` wherever the rule stands; a rule without a name is "#N" (its
// 1-based place), as the resolver and the admin API call it. A named
// item that now comes before another it came after (first match wins)
// says where it stood and stands: `limits.rules[doors]: "(item
// name=doors at [3])" -> "(item name=doors at [0])"`.
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
	fa, fb := flattenByName(running), flattenByName(next)
	a, b := fa.out, fb.out
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
	}
	changes = append(changes, moves(fa, fb)...)
	slices.SortStableFunc(changes, func(x, y Change) int { return strings.Compare(x.Key, y.Key) })
	for _, c := range changes {
		if !IsReloadable(c.Key) {
			refused = append(refused, &FieldError{Key: c.Key, Msg: fmt.Sprintf("cannot change without a restart (running %q, file %q)", c.Old, c.New)})
		}
	}
	if len(refused) > 0 {
		return changes, errors.Join(refused...)
	}
	return changes, nil
}

// NamedLists are the lists (keys of the reference) whose items a reload
// compares by name, not by place (Change): an item's name says which
// rule or class it is, to the resolver, the admin API and the metrics.
var NamedLists = []string{"limits.rules", "limits.classes", "limits.rules[].classes"}

// moves returns a change for each named item both sides have whose
// order among the items both have changed: the fewest such items, those
// off a longest run of the items in the same order on both sides.
func moves(a, b flattener) []Change {
	var out []Change
	for list, old := range a.order {
		now, ok := b.order[list]
		if !ok {
			continue
		}
		oldAt, nowAt := indexOf(old), indexOf(now)
		var x, y []string // the items on both sides, in each side's order
		for _, k := range old {
			if _, ok := nowAt[k]; ok {
				x = append(x, k)
			}
		}
		for _, k := range now {
			if _, ok := oldAt[k]; ok {
				y = append(y, k)
			}
		}
		stay := commonRun(x, y)
		for _, k := range y {
			if !stay[k] {
				out = append(out, Change{Key: k,
					Old: fmt.Sprintf("%s at [%d])", strings.TrimSuffix(a.out[k], ")"), oldAt[k]),
					New: fmt.Sprintf("%s at [%d])", strings.TrimSuffix(b.out[k], ")"), nowAt[k])})
			}
		}
	}
	return out
}

// indexOf returns each key's place in keys.
func indexOf(keys []string) map[string]int {
	m := make(map[string]int, len(keys))
	for i, k := range keys {
		m[k] = i
	}
	return m
}

// commonRun returns the items of a longest subsequence common to x and
// y, which hold the same items in two orders.
func commonRun(x, y []string) map[string]bool {
	// n[i][j] is the length of the longest common subsequence of x[i:]
	// and y[j:].
	n := make([][]int, len(x)+1)
	for i := range n {
		n[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				n[i][j] = n[i+1][j+1] + 1
			} else {
				n[i][j] = max(n[i+1][j], n[i][j+1])
			}
		}
	}
	stay := make(map[string]bool, n[0][0])
	for i, j := 0, 0; i < len(x) && j < len(y); {
		switch {
		case x[i] == y[j]:
			stay[x[i]] = true
			i, j = i+1, j+1
		case n[i+1][j] >= n[i][j+1]:
			i++
		default:
			j++
		}
	}
	return stay
}

// Flatten returns every key of c with its value as text: "mqtt.tcp",
// "limits.rules[0].quota.limit", "forward[1].rate"... Each item of a
// list is also listed under its own key ("forward[1]"), so that an item
// added or removed is one change, not one per key in it.
func Flatten(c Config) map[string]string {
	f := flattener{out: make(map[string]string)}
	f.walk(reflect.ValueOf(c), "", "")
	return f.out
}

// flattenByName is Flatten with the items of NamedLists keyed by name
// ("limits.rules[meters]"), each such list's item keys in order.
func flattenByName(c Config) flattener {
	f := flattener{out: make(map[string]string), order: make(map[string][]string)}
	f.walk(reflect.ValueOf(c), "", "")
	return f
}

// flattener collects the keys of a configuration (Flatten); with order
// set, it keys the items of NamedLists by name and lists them in order
// by their list's key.
type flattener struct {
	out   map[string]string
	order map[string][]string
}

var (
	stringerType = reflect.TypeFor[fmt.Stringer]()
	levelType    = reflect.TypeFor[slog.Level]()
)

// walk adds v's keys under key; ref is key as the reference writes it,
// every item "[]".
func (f flattener) walk(v reflect.Value, key, ref string) {
	out := f.out
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
			f.walk(v.Elem(), key, ref)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			field := t.Field(i)
			if !field.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(field.Tag.Get("yaml"), ",")
			f.walk(v.Field(i), join(key, name), join(ref, name))
		}
	case reflect.Slice:
		named := f.order != nil && slices.Contains(NamedLists, ref)
		for i := range v.Len() {
			item := fmt.Sprintf("%s[%d]", key, i)
			label := itemLabel(v.Index(i)) // a scalar item's value replaces it
			if named {
				name := itemName(v.Index(i), i)
				item, label = key+"["+nameKey(name)+"]", "(item name="+name+")"
				f.order[key] = append(f.order[key], item)
			}
			out[item] = label
			f.walk(v.Index(i), item, ref+"[]")
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
	if name := nameField(v); name != "" {
		return "(item name=" + name + ")"
	}
	return "(item)"
}

// itemName is the name of item i of a named list: its name field, else
// "#i+1" (Limits.RuleName).
func itemName(v reflect.Value, i int) string {
	if name := nameField(v); name != "" {
		return name
	}
	return fmt.Sprintf("#%d", i+1)
}

// nameField returns the struct v's name field, "" for none.
func nameField(v reflect.Value) string {
	for v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		t := v.Type()
		for i := range t.NumField() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			if f := v.Field(i); name == "name" && f.Kind() == reflect.String {
				return f.String()
			}
		}
	}
	return ""
}

// nameKey is name as an item's index in a key: as it is, unless it
// could read as a place or as a key's punctuation: then quoted, its
// brackets escaped (inMissingItem reads up to each ']').
func nameKey(name string) string {
	plain := name != "" && strings.Trim(name, "0123456789") != ""
	for _, r := range name {
		if r <= ' ' || r == 0x7f || strings.ContainsRune(`[]."`, r) {
			plain = false
		}
	}
	if plain {
		return name
	}
	q := strconv.Quote(name)
	return strings.NewReplacer("[", `\x5b`, "]", `\x5d`).Replace(q)
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
