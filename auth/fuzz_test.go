package auth

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParseFile checks that ParseFile never panics, that every error
// says something, and that what it accepts builds Credentials and
// survives FormatFile and ParseFile unchanged.
func FuzzParseFile(f *testing.F) {
	for _, s := range []string{
		"",
		"# comment\n\n",
		"dev-1:" + "$2a$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy" + ":device:dev-1,sensor-*\n",
		"b:$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5:consumer:\r\n",
		"a:b:c:d\n", "a:::\n", "::::\n", "a:$2y$04$x:device:\n",
		"x:$argon2id$v=19$m=8,t=1,p=1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA:device:\\*\n",
		"x:$argon2id$v=16$m=8,t=1,p=1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA:device:\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		entries, err := ParseFile(strings.NewReader(in))
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if _, err := New(entries); err != nil {
			t.Fatalf("parsed entries refused by New: %v", err)
		}
		var b bytes.Buffer
		if err := FormatFile(&b, entries); err != nil {
			t.Fatal(err)
		}
		again, err := ParseFile(&b)
		if err != nil {
			t.Fatalf("formatted file refused: %v\n%s", err, b.String())
		}
		if len(again) != len(entries) {
			t.Fatalf("round trip: %d entries, want %d", len(again), len(entries))
		}
		for i := range again {
			if again[i].Line() != entries[i].Line() {
				t.Fatalf("round trip: %q, want %q", again[i].Line(), entries[i].Line())
			}
		}
	})
}
