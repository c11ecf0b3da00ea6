package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/devicegate/devicegate/devicelimit"
)

// MaxSize is the largest configuration Parse reads.
const MaxSize = 1 << 20

// maxErrors bounds how many problems one Parse or Validate reports.
const maxErrors = 20

// Parse reads a YAML configuration over Default: keys the input sets
// replace the defaults, the others keep them, and an empty input gives
// Default. Unknown keys, values of the wrong type and durations that are
// not strings like "10s" are errors naming the key and line (joined, at
// most 20). Parse does not Validate; a name no setting has (a policy,
// the identity, the log level) is left for Validate to report with the
// other problems, the field holding its default meanwhile.
func Parse(r io.Reader) (Config, error) {
	cfg := Default()
	data, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	if len(data) > MaxSize {
		return Config{}, fmt.Errorf("config is larger than %d bytes", MaxSize)
	}

	// First pass: the node tree, checked against the schema so that
	// every error names the full key. yaml.v3's own messages name only a
	// line and a Go type.
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return Config{}, fmt.Errorf("config: %w", yamlSyntaxError(err))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return cfg, nil // empty, or only comments
	}
	root := doc.Content[0]
	if isNull(root) {
		return cfg, nil
	}
	w := walker{present: make(map[string]bool), badNames: make(map[string]string)}
	w.walk(root, reflect.TypeFor[Config](), "")
	if len(w.errs) > 0 {
		return Config{}, joinErrors(w.errs, w.dropped)
	}

	// Second pass: the decode proper, with yaml.v3 rejecting unknown
	// fields too, in case the walk and the decoder ever disagree. It
	// decodes the walked tree, in which the names the walk refused are
	// now those of their types' zero values; Validate reports them.
	walked := data
	if len(w.badNames) > 0 {
		if walked, err = yaml.Marshal(root); err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		cfg.badNames = w.badNames
	}
	dec := yaml.NewDecoder(bytes.NewReader(walked))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	dec = yaml.NewDecoder(bytes.NewReader(data))
	var first, extra yaml.Node
	_ = dec.Decode(&first) // parsed above
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		return Config{}, fmt.Errorf("config: line %d: a second YAML document starts here; put all keys in one document", extra.Line)
	}

	// A quota gives limit and window, or windows. limits.default's
	// windows replace its default limit and window.
	mixed := func(p string) bool {
		if w.present[p+"windows"] && (w.present[p+"limit"] || w.present[p+"window"]) {
			cfg.mixed = append(cfg.mixed, strings.TrimSuffix(p, "."))
			return true
		}
		return false
	}
	if !mixed("limits.default.") && w.present["limits.default.windows"] {
		cfg.Limits.Default.Limit, cfg.Limits.Default.Window = 0, 0
	}
	for i := range cfg.Limits.Classes {
		mixed(fmt.Sprintf("limits.classes[%d].quota.", i))
	}
	for i, r := range cfg.Limits.Rules {
		for j := range r.Classes {
			mixed(fmt.Sprintf("limits.rules[%d].classes[%d].quota.", i, j))
		}
		mixed(fmt.Sprintf("limits.rules[%d].group.quota.", i))
	}
	mixed("limits.group.quota.")
	for i := range cfg.Limits.Classes {
		if c := &cfg.Limits.Classes[i].Quota; c.Feedback == nil {
			c.Feedback = cfg.Limits.Default.Feedback
		}
	}
	// A rule's quota keys that are absent come from limits.default:
	// its limit and window, or its windows, when the rule gives neither.
	for i := range cfg.Limits.Rules {
		q := &cfg.Limits.Rules[i].Quota
		p := fmt.Sprintf("limits.rules[%d].quota.", i)
		own := w.present[p+"windows"] || w.present[p+"limit"] || w.present[p+"window"]
		if !mixed(p) && !w.present[p+"windows"] {
			if !w.present[p+"limit"] {
				q.Limit = cfg.Limits.Default.Limit
			}
			if !w.present[p+"window"] {
				q.Window = cfg.Limits.Default.Window
			}
			if !own {
				q.Windows = cfg.Limits.Default.Windows
			}
		}
		if !w.present[p+"policy"] {
			q.Policy = cfg.Limits.Default.Policy
		}
		if !w.present[p+"feedback"] {
			q.Feedback = cfg.Limits.Default.Feedback
		}
		// A topic class's feedback is its rule's unless it says.
		for j := range cfg.Limits.Rules[i].Classes {
			if c := &cfg.Limits.Rules[i].Classes[j].Quota; c.Feedback == nil {
				c.Feedback = q.Feedback
			}
		}
	}
	if len(cfg.Limits.Rules) == 0 {
		cfg.Limits.Rules = nil
	}
	// An upstream's QoS is at most 1 unless the file says 0.
	for i := range cfg.Forward {
		if !w.present[fmt.Sprintf("forward[%d].max_qos", i)] {
			cfg.Forward[i].MaxQoS = 1
		}
	}
	return cfg, nil
}

// UnmarshalYAML reads a duration string such as "10s".
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, msg := parseDuration(n)
	if msg != "" {
		return fmt.Errorf("line %d: %s", n.Line, msg)
	}
	*d = Duration(v)
	return nil
}

func parseDuration(n *yaml.Node) (time.Duration, string) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
		if v, err := time.ParseDuration(n.Value); err == nil {
			return v, ""
		}
	}
	return 0, fmt.Sprintf("must be a duration like \"10s\" (got %s)", describe(n))
}

// walker checks a node tree against the Config schema: the yaml tags
// of its struct types. It follows the types, not the nodes, so its work
// is bounded by the size of the input even with aliases.
type walker struct {
	errs     []error
	dropped  int
	present  map[string]bool   // keys set to a non-null value
	badNames map[string]string // see Config.badNames
}

var (
	durationType = reflect.TypeFor[Duration]()
	sizeType     = reflect.TypeFor[Size]()
	feedbackType = reflect.TypeFor[Feedback]()
)

// names are the fields written as one of a few names, each with its
// parser: the walk checks the name, and decoding (encoding.TextUnmarshaler)
// stores the typed value.
var names = map[reflect.Type]struct {
	parse func(string) error
	zero  string // the name of the type's zero value
}{
	reflect.TypeFor[devicelimit.Policy]():   {func(s string) error { _, err := ParsePolicy(s); return err }, "drop"},
	reflect.TypeFor[devicelimit.Identity](): {func(s string) error { _, err := devicelimit.ParseIdentity(s); return err }, "client_id"},
	reflect.TypeFor[slog.Level]():           {func(s string) error { _, err := ParseLevel(s); return err }, "info"},
}

func (w *walker) fail(n *yaml.Node, key, format string, args ...any) {
	if len(w.errs) == maxErrors {
		w.dropped++
		return
	}
	w.errs = append(w.errs, &FieldError{Key: key, Line: n.Line, Msg: fmt.Sprintf(format, args...)})
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if isNull(n) {
		return // an empty key keeps its default
	}
	w.present[path] = true
	if t == durationType {
		if _, msg := parseDuration(n); msg != "" {
			w.fail(n, path, "%s", msg)
		}
		return
	}
	if t == sizeType {
		if _, msg := parseSize(n); msg != "" {
			w.fail(n, path, "%s", msg)
		}
		return
	}
	if t == feedbackType {
		if _, msg := parseFeedback(n); msg != "" {
			w.fail(n, path, "%s", msg)
		}
		return
	}
	if nm, ok := names[t]; ok {
		if n.Kind != yaml.ScalarNode {
			w.fail(n, path, "must be a string (got %s)", describe(n))
			return
		}
		if err := nm.parse(n.Value); err != nil {
			// Validate reports it; decoding takes the zero value.
			w.badNames[path] = err.Error()
			n.Value, n.Tag, n.Style = nm.zero, "!!str", 0
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			w.fail(n, path, "must be a mapping of keys (got %s)", describe(n))
			return
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			name := k.Value
			if k.Kind != yaml.ScalarNode {
				name = "?"
			}
			f, ok := fields[name]
			if !ok {
				msg := "unknown key; expected one of " + strings.Join(fieldNames(t), ", ")
				if name == "<<" {
					msg = "merge keys (<<) are not supported; use an alias (*name) for a whole value"
				}
				w.fail(k, join(path, quoteKey(name)), "%s", msg)
				continue
			}
			w.walk(v, f.Type, join(path, name))
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.fail(n, path, "must be a list (got %s)", describe(n))
			return
		}
		for i, e := range n.Content {
			w.walk(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			w.fail(n, path, "must be a string (got %s)", describe(n))
		}
	case reflect.Int:
		var v int
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
			w.fail(n, path, "must be an integer (got %s)", describe(n))
		}
	case reflect.Float64:
		var v float64
		if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") || n.Decode(&v) != nil {
			w.fail(n, path, "must be a number (got %s)", describe(n))
		}
	case reflect.Pointer:
		w.walk(n, t.Elem(), path)
	case reflect.Bool:
		var v bool
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&v) != nil {
			w.fail(n, path, "must be true or false (got %s)", describe(n))
		}
	default:
		// A field type this walk does not know: a mistake in this
		// package, reported rather than panicking on outside input.
		w.fail(n, path, "cannot be checked: config has no schema check for %s", t)
	}
}

func yamlFields(t reflect.Type) map[string]reflect.StructField {
	m := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue // Config.badNames: not a key
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		m[name] = f
	}
	return m
}

func fieldNames(t reflect.Type) []string {
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		if !t.Field(i).IsExported() {
			continue
		}
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		names = append(names, name)
	}
	return names
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// quoteKey quotes a key that is not a plain word, so that a stray
// newline or dot in an unknown key cannot disguise the path.
func quoteKey(k string) string {
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return strconv.Quote(k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}

// describe shows a node the way a person wrote it: strings quoted,
// numbers and booleans bare, collections by kind.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 64 {
			v = v[:64] + "..."
		}
		if n.ShortTag() == "!!str" {
			return strconv.Quote(v)
		}
		return v
	}
	return "an alias"
}
