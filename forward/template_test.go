package forward

import "testing"

// TestTemplate: fields are replaced wherever they stand, text is kept
// (stray braces too), an empty template is the default.
func TestTemplate(t *testing.T) {
	upper := func(b []byte, s string, topic bool) []byte {
		if topic {
			return append(b, "T:"+s...)
		}
		return append(b, "D:"+s...)
	}
	for _, c := range []struct{ tmpl, def, want string }{
		{"", "{topic}", "T:a/b"},
		{"x.{device}.{topic}.y", "", "x.D:m1.T:a/b.y"},
		{"{device}{device}", "", "D:m1D:m1"},
		{"a{b}c{topic", "", "a{b}c{topic"},
		{"fixed", "{topic}", "fixed"},
	} {
		if got := ParseTemplate(c.tmpl, c.def).Expand("a/b", "m1", upper); got != c.want {
			t.Errorf("ParseTemplate(%q, %q).Expand = %q, want %q", c.tmpl, c.def, got, c.want)
		}
	}
}
