package config

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// referencePath is the configuration reference, relative to this package.
const referencePath = "../docs/configuration.md"

// schemaKeys returns every key the parser accepts, as the reference
// writes it: the full dotted path, list items as "rules[]". A key is a
// leaf of the YAML schema (a scalar, a duration, a size, one of a few
// names, or a list of scalars); mappings and lists of mappings are
// written through their leaves. It follows the types as the parser's
// walk does (yamlFields, pointers dereferenced).
func schemaKeys(t reflect.Type, path string, out map[string]reflect.Type) {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if _, named := names[t]; t == durationType || t == sizeType || t == feedbackType || named {
		out[path] = t
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		for name, f := range yamlFields(t) {
			schemaKeys(f.Type, join(path, name), out)
		}
	case reflect.Slice:
		if e := t.Elem(); e.Kind() == reflect.Struct || (e.Kind() == reflect.Pointer && e.Elem().Kind() == reflect.Struct) {
			schemaKeys(e, path+"[]", out)
			return
		}
		out[path] = t
	default:
		out[path] = t
	}
}

// referenceRow is one row of the reference's tables.
type referenceRow struct {
	key, typ, def, reload, meaning string
	line                           int
}

// referenceRows reads the rows of every `| Key | Type | Default | Reload
// | Meaning |` table of the reference.
func referenceRows(t *testing.T) []referenceRow {
	t.Helper()
	b, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	var rows []referenceRow
	inTable := false
	for i, line := range strings.Split(string(b), "\n") {
		if line == "| Key | Type | Default | Reload | Meaning |" {
			inTable = true
			continue
		}
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		if !inTable || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := splitRow(line)
		if len(cells) != 5 {
			t.Fatalf("%s:%d: %d cells, want 5: %s", referencePath, i+1, len(cells), line)
		}
		key, ok := strings.CutPrefix(cells[0], "`")
		key, ok2 := strings.CutSuffix(key, "`")
		if !ok || !ok2 || strings.Contains(key, "`") {
			t.Fatalf("%s:%d: the key must be one code span: %s", referencePath, i+1, cells[0])
		}
		rows = append(rows, referenceRow{key, cells[1], cells[2], cells[3], cells[4], i + 1})
	}
	return rows
}

// splitRow splits a Markdown table row into its cells; a | inside a code
// span, or escaped as \|, does not split.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(strings.TrimSuffix(line, "|"), "|")
	var cells []string
	var cur strings.Builder
	code := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
			continue
		case c == '`':
			code = !code
		case c == '|' && !code:
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// TestReferenceCoversTheParser holds docs/configuration.md to the
// parser: every key the parser accepts has exactly one row, every row
// names a key the parser accepts, Reload is yes or no, and a default
// written as one code span is what config.Default() holds (the value is
// parsed as the key's YAML and compared). Defaults of list items, and of
// keys under a mapping Default leaves out (limits.group, a quota's
// block), are not in Default: their rows say so in words, not code.
func TestReferenceCoversTheParser(t *testing.T) {
	keys := map[string]reflect.Type{}
	schemaKeys(reflect.TypeFor[Config](), "", keys)
	seen := map[string]int{}
	for _, row := range referenceRows(t) {
		if prev, dup := seen[row.key]; dup {
			t.Errorf("%s:%d: %s has a row already, at line %d", referencePath, row.line, row.key, prev)
		}
		seen[row.key] = row.line
		if _, ok := keys[row.key]; !ok {
			t.Errorf("%s:%d: %s is not a key the parser accepts", referencePath, row.line, row.key)
			continue
		}
		if row.reload != "yes" && row.reload != "no" {
			t.Errorf("%s:%d: %s: Reload must be yes or no (got %q)", referencePath, row.line, row.key, row.reload)
		}
		if msg := checkDefault(row); msg != "" {
			t.Errorf("%s:%d: %s: %s", referencePath, row.line, row.key, msg)
		}
	}
	var missing []string
	for k := range keys {
		if _, ok := seen[k]; !ok {
			missing = append(missing, k)
		}
	}
	slices.Sort(missing)
	for _, k := range missing {
		t.Errorf("%s: the parser accepts %s, which has no row", referencePath, k)
	}
}

// codeSpanRE matches a cell that is one code span and nothing else.
var codeSpanRE = regexp.MustCompile("^`([^`]+)`$")

// checkDefault returns what is wrong with row's default, or "".
func checkDefault(row referenceRow) string {
	if strings.Contains(row.key, "[]") {
		return ""
	}
	want, ok := valueAt(reflect.ValueOf(Default()), row.key)
	m := codeSpanRE.FindStringSubmatch(row.def)
	switch {
	case !ok && m != nil:
		return fmt.Sprintf("Default() leaves the key out, so its default is words, not the value %s", row.def)
	case !ok:
		return ""
	case m == nil:
		return fmt.Sprintf("the default must be the value in code, as YAML: Default() has %v (got %q)", want.Interface(), row.def)
	}
	doc := yamlAt(row.key, m[1])
	cfg, err := Parse(strings.NewReader(doc))
	if err != nil {
		return fmt.Sprintf("the documented default %s does not parse: %v", row.def, err)
	}
	got, _ := valueAt(reflect.ValueOf(cfg), row.key)
	emptyLists := got.Kind() == reflect.Slice && got.Len() == 0 && want.Len() == 0
	if !emptyLists && !reflect.DeepEqual(got.Interface(), want.Interface()) {
		return fmt.Sprintf("documented default %s is %v, Default() has %v", row.def, got.Interface(), want.Interface())
	}
	return ""
}

// valueAt follows the dotted key through v's yaml fields; false when a
// pointer on the way is nil.
func valueAt(v reflect.Value, key string) (reflect.Value, bool) {
	for name := range strings.SplitSeq(key, ".") {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return v, false
			}
			v = v.Elem()
		}
		v = v.FieldByIndex(yamlFields(v.Type())[name].Index)
	}
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return v, false
	}
	return v, true
}

// yamlAt returns a YAML document setting the dotted key to value.
func yamlAt(key, value string) string {
	var b strings.Builder
	parts := strings.Split(key, ".")
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i == len(parts)-1 {
			b.WriteString(" " + value)
		}
		b.WriteString("\n")
	}
	return b.String()
}
