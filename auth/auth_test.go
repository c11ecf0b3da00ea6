package auth

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bcrypt and argon2id hashes of "secret", made once: hashing is slow.
var (
	bcryptSecret, argonSecret string
)

func TestMain(m *testing.M) {
	var err error
	if bcryptSecret, err = HashPassword(Bcrypt, []byte("secret")); err != nil {
		panic(err)
	}
	if argonSecret, err = HashPassword(Argon2id, []byte("secret")); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

func TestCheck(t *testing.T) {
	c, err := New([]Entry{
		{Username: "dev-1", Hash: bcryptSecret},
		{Username: "fleet", Hash: argonSecret, ClientIDs: []string{"sensor-*", "gw-?"}},
		{Username: "backend", Hash: argonSecret, Role: RoleConsumer},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user, pass, client string
		role               Role
		want               Login
	}{
		{"dev-1", "secret", "dev-1", RoleDevice, LoginOK},
		{"dev-1", "secret", "dev-1", RoleDevice, LoginOK}, // from the verified cache
		{"dev-1", "Secret", "dev-1", 0, LoginBadPassword},
		{"dev-1", "secret", "dev-2", RoleDevice, LoginClientIDNotAllowed},
		{"dev-1", "secret", "dev-*", RoleDevice, LoginClientIDNotAllowed},
		{"nobody", "secret", "nobody", 0, LoginUnknownUser},
		{"fleet", "secret", "sensor-7", RoleDevice, LoginOK},
		{"fleet", "secret", "gw-1", RoleDevice, LoginOK},
		{"fleet", "secret", "gw-12", RoleDevice, LoginClientIDNotAllowed},
		{"fleet", "wrong", "sensor-7", 0, LoginBadPassword},
		{"fleet", "", "sensor-7", 0, LoginBadPassword},
		{"backend", "secret", "backend", RoleConsumer, LoginOK},
	} {
		role, got := c.Check(tc.user, []byte(tc.pass), tc.client)
		if got != tc.want || role != tc.role {
			t.Errorf("Check(%q, %q, %q) = %v, %v; want %v, %v", tc.user, tc.pass, tc.client, role, got, tc.role, tc.want)
		}
	}
}

func TestParseFileErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"dev:secret:device:\n", "line 1: invalid credentials: user \"dev\": hash not a bcrypt or argon2id hash (plain-text"},
		{"# c\n\ndev:" + bcryptSecret + ":admin:\n", "line 3: invalid credentials: role must be device or consumer (got \"admin\")"},
		{"dev:" + bcryptSecret + ":device\n", "line 1: invalid credentials: want username:hash:role:client-id-patterns (3 fields, want 4)"},
		{"dev:" + bcryptSecret + ":device:a\\\n", "client-ID pattern \"a\\\\\""},
		{"dev:" + bcryptSecret + ":device:\ndev:" + argonSecret + ":device:\n", "line 2: invalid credentials: user \"dev\" is also on line 1"},
		{"d v:" + bcryptSecret + ":device:\n", "white space"},
		{"dev:$argon2id$v=19$m=99999999,t=1,p=1$c2FsdHNhbHQ$a2V5a2V5a2V5a2V5a2V5a2V5:device:\n", "m must be"},
		// A bcrypt cost of 31 is 2^21 times the default's work: a day of
		// CPU for every login attempt on that account.
		{"dev:" + strings.Replace(bcryptSecret, "$"+bcryptSecret[4:6]+"$", "$31$", 1) + ":device:\n", "cost must be 4..16"},
	} {
		_, err := ParseFile(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidCredentials) {
			t.Errorf("ParseFile(%q) = %v; want an ErrInvalidCredentials containing %q", tc.in, err, tc.want)
		}
	}
}

func TestPut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "creds")
	a := Entry{Username: "a", Hash: bcryptSecret}
	b := Entry{Username: "b", Hash: argonSecret, Role: RoleConsumer, ClientIDs: []string{"b-*"}}
	for _, e := range []Entry{a, b} {
		if err := Put(path, e); err != nil {
			t.Fatal(err)
		}
	}
	a.ClientIDs = []string{"a1", "a2"}
	if err := Put(path, a); err != nil { // replaces, keeps the order
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	f, _ := os.Open(path)
	got, err := ParseFile(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Line() != a.Line() || got[1].Line() != b.Line() {
		t.Fatalf("file holds %+v, want a then b", got)
	}
	// A bad entry and a file that does not parse change nothing.
	before, _ := os.ReadFile(path)
	if err := Put(path, Entry{Username: "c", Hash: "plain"}); err == nil {
		t.Fatal("Put with a plain-text hash succeeded")
	}
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("garbage\n"), 0o600)
	if err := Put(bad, a); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("Put into a broken file = %v, want an error naming it", err)
	}
	after, _ := os.ReadFile(path)
	if string(before) != string(after) {
		t.Fatal("a refused Put changed the file")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d files, want 1 (temporary files left?)", len(entries))
	}
}

func TestACL(t *testing.T) {
	acl, err := NewACL(DefaultPublish, DefaultSubscribe)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		topic    string
		pub, sub bool
	}{
		{"devices/d1/temp", true, false},
		{"devices/d1", true, false},
		{"devices/d1/a/b/c", true, false},
		{"devices/d1/cmd/reboot", true, true},
		{"devices/d1/cmd", true, true},
		{"devices/d1/cmd/#", true, true},
		{"devices/d1/cmd/+", true, true},
		{"devices/d2/temp", false, false},
		{"devices/d2/cmd/x", false, false},
		{"devices/+/cmd/x", false, false},
		{"devices/#", false, false},
		{"#", false, false},
		{"devices/d1x/temp", false, false},
		{"other/d1/temp", false, false},
		{"$share/g/devices/d1/cmd/x", false, false},
	} {
		if got := acl.CanPublish("d1", tc.topic); got != tc.pub {
			t.Errorf("CanPublish(d1, %q) = %v, want %v", tc.topic, got, tc.pub)
		}
		if got := acl.CanSubscribe("d1", tc.topic); got != tc.sub {
			t.Errorf("CanSubscribe(d1, %q) = %v, want %v", tc.topic, got, tc.sub)
		}
	}
	plus, _ := NewACL("t/+/{device}", "t/{device}/+/x")
	for _, tc := range []struct {
		topic    string
		pub, sub bool
	}{
		{"t/a/d1", true, false},
		{"t/+/d1", true, false},
		{"t/#", false, false},
		{"t/a/d1/x", false, false},
		{"t/d1/q/x", false, true},
		{"t/d1/+/x", false, true},
		{"t/d1/q", false, false},
	} {
		if got := plus.CanPublish("d1", tc.topic); got != tc.pub {
			t.Errorf("t/+/{device}: CanPublish(d1, %q) = %v, want %v", tc.topic, got, tc.pub)
		}
		if got := plus.CanSubscribe("d1", tc.topic); got != tc.sub {
			t.Errorf("t/{device}/+/x: CanSubscribe(d1, %q) = %v, want %v", tc.topic, got, tc.sub)
		}
	}
	for _, bad := range []string{"devices/#", "devices/#/{device}", "devices/x{device}", "a/b+/{device}"} {
		if err := CheckTemplate(bad); !errors.Is(err, ErrInvalidTemplate) {
			t.Errorf("CheckTemplate(%q) = %v, want ErrInvalidTemplate", bad, err)
		}
	}
	if n := testing.AllocsPerRun(100, func() { acl.CanPublish("d1", "devices/d1/a/b") }); n != 0 {
		t.Errorf("CanPublish allocates %v times", n)
	}
}

func TestCertIdentity(t *testing.T) {
	u, _ := url.Parse("spiffe://fleet/d-uri")
	c := &x509.Certificate{Subject: pkix.Name{CommonName: "d-cn"}, DNSNames: []string{"d-dns"},
		EmailAddresses: []string{"d@x"}, URIs: []*url.URL{u}}
	for _, tc := range []struct{ field, want string }{{"cn", "d-cn"}, {"dns", "d-dns"}, {"email", "d@x"}, {"uri", "spiffe://fleet/d-uri"}} {
		f, err := ParseCertField(tc.field)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := f.Identity(c); got != tc.want || err != nil {
			t.Errorf("%s: Identity = %q, %v; want %q", tc.field, got, err, tc.want)
		}
	}
	if _, err := CertDNS.Identity(&x509.Certificate{}); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("Identity of a certificate without SAN = %v, want ErrNoIdentity", err)
	}
	if _, err := ParseCertField("ou"); err == nil {
		t.Error("ParseCertField(ou) succeeded")
	}
}

// TestLoadFileRefusesWritableByOthers: a credentials file anyone on the
// host may write lets anyone add an account; LoadFile refuses it, naming
// the file and the mode, and loads it once the mode is fixed.
func TestLoadFileRefusesWritableByOthers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "creds")
	if err := Put(path, Entry{Username: "a", Hash: bcryptSecret}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "-rw-rw-rw-") {
		t.Fatalf("LoadFile of a world-writable file = %v, want an error naming the file and its mode", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := LoadFile(path); err != nil || c.Len() != 1 {
		t.Fatalf("LoadFile of a 0644 file = %v, %v; want 1 account", c, err)
	}
}

// Password checks beyond maxVerifyQueue running or waiting are not
// queued: Check answers LoginBusy at once, without checking, and checks
// again once the queue has room. A password already verified needs no
// check and is not refused.
func TestCheckBusyWhenQueueFull(t *testing.T) {
	c, err := New([]Entry{{Username: "dev-1", Hash: bcryptSecret}, {Username: "dev-2", Hash: bcryptSecret}})
	if err != nil {
		t.Fatal(err)
	}
	if _, got := c.Check("dev-2", []byte("secret"), "dev-2"); got != LoginOK {
		t.Fatalf("dev-2 first login: %v", got)
	}
	verifyQueue.Add(maxVerifyQueue) // the queue is full
	for _, pass := range []string{"secret", "wrong"} {
		if _, got := c.Check("dev-1", []byte(pass), "dev-1"); got != LoginBusy {
			t.Errorf("with the queue full, Check(dev-1, %q) = %v; want LoginBusy", pass, got)
		}
	}
	if _, got := c.Check("dev-2", []byte("secret"), "dev-2"); got != LoginOK {
		t.Errorf("with the queue full, a password verified before = %v; want LoginOK", got)
	}
	verifyQueue.Add(-maxVerifyQueue)
	if _, got := c.Check("dev-1", []byte("secret"), "dev-1"); got != LoginOK {
		t.Errorf("with room again, Check = %v; want LoginOK", got)
	}
	if n := verifyQueue.Load(); n != 0 {
		t.Errorf("queue holds %d after the checks, want 0", n)
	}
}
