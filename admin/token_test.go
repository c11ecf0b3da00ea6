package admin

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOrCreateTokenPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, TokenFile)
	if err := os.WriteFile(path, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(TokenEnv, "from-env")
	tok, p, created, err := LoadOrCreateToken("configured", dir)
	if err != nil || tok != "configured" || p != "" || created {
		t.Fatalf("configured: %q %q %v %v", tok, p, created, err)
	}
	tok, p, created, err = LoadOrCreateToken("", dir)
	if err != nil || tok != "from-env" || p != "" || created {
		t.Fatalf("env: %q %q %v %v", tok, p, created, err)
	}
	t.Setenv(TokenEnv, "")
	tok, p, created, err = LoadOrCreateToken("", dir)
	if err != nil || tok != "from-file" || p != path || created {
		t.Fatalf("file: %q %q %v %v", tok, p, created, err)
	}
}

func TestLoadOrCreateTokenCreates(t *testing.T) {
	t.Setenv(TokenEnv, "")
	dir := filepath.Join(t.TempDir(), "data") // not there yet
	tok, path, created, err := LoadOrCreateToken("", dir)
	if err != nil || !created || path != filepath.Join(dir, TokenFile) {
		t.Fatalf("create: %q %v %v", path, created, err)
	}
	if b, err := hex.DecodeString(tok); err != nil || len(tok) != 64 || len(b) != 32 {
		t.Fatalf("token %d chars, want 64 hex: %v", len(tok), err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	again, path2, created, err := LoadOrCreateToken("", dir)
	if err != nil || created || again != tok || path2 != path {
		t.Fatalf("reload: same %v, created %v, err %v", again == tok, created, err)
	}
	// A second generated token differs.
	other, _, _, err := LoadOrCreateToken("", t.TempDir())
	if err != nil || other == tok {
		t.Fatalf("second token equal or error: %v", err)
	}
}

func TestLoadOrCreateTokenRefusesBadFiles(t *testing.T) {
	t.Setenv(TokenEnv, "")
	for _, tt := range []struct {
		name    string
		content string
		mode    os.FileMode
		want    string
	}{
		{"world readable", "Zq9secret", 0o644, "chmod 600"},
		{"group readable", "Zq9secret", 0o640, "chmod 600"},
		{"empty", "", 0o600, "empty"},
		{"blank", " \n", 0o600, "empty"},
		{"two lines", "a\nb\n", 0o600, "more than one"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, TokenFile)
			if err := os.WriteFile(path, []byte(tt.content), tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tt.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			_, _, created, err := LoadOrCreateToken("", dir)
			if err == nil || created || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("got err %v (created %v), want one naming %q and containing %q", err, created, path, tt.want)
			}
			if strings.TrimSpace(tt.content) != "" && strings.Contains(err.Error(), strings.TrimSpace(tt.content)) && tt.name != "two lines" {
				t.Fatalf("error shows the token: %v", err)
			}
			b, _ := os.ReadFile(path)
			if string(b) != tt.content {
				t.Fatalf("file changed to %q", b)
			}
		})
	}
	if _, _, _, err := LoadOrCreateToken("", ""); err == nil {
		t.Fatal("no data dir: no error")
	}
}

// The token reaches neither the logs nor any response, whatever the
// request.
func TestTokenNotLogged(t *testing.T) {
	e := newEnv(t, 0)
	e.do("PUT", devPath("d", "/quota"), `{"limit":1,"window":"1s"}`, nil)
	e.do("DELETE", devPath("d", "/quota"), "", nil)
	e.do("POST", devPath("d", "/reset"), "", nil)
	e.do("GET", devPath("d", ""), "", map[string]string{"Authorization": "Bearer wrong"})
	e.do("PUT", devPath("d", "/quota"), `{"limit":0}`, nil)
	if e.logs.Len() == 0 {
		t.Fatal("nothing logged: the test proves nothing")
	}
	if bytes.Contains(e.logs.Bytes(), []byte(testToken)) {
		t.Fatalf("token in logs:\n%s", e.logs)
	}
}

// A GATEWAY_ADMIN_TOKEN that no request could send is refused with an
// error that names the variable and leaves the token out, and no token
// file is written in its place.
func TestLoadOrCreateTokenRefusesUnusableEnv(t *testing.T) {
	for _, env := range []string{" secret-token", "secret-token\n", "secret\x01token"} {
		dir := t.TempDir()
		t.Setenv(TokenEnv, env)
		tok, _, created, err := LoadOrCreateToken("", dir)
		if err == nil || tok != "" || created {
			t.Fatalf("env %q: token %q, created %v, err %v; want an error", env, tok, created, err)
		}
		if !strings.Contains(err.Error(), TokenEnv) || strings.Contains(err.Error(), "secret") {
			t.Fatalf("env %q: error %q should name %s and leave the token out", env, err, TokenEnv)
		}
		if _, err := os.Stat(filepath.Join(dir, TokenFile)); !os.IsNotExist(err) {
			t.Fatalf("env %q: a token file was written (%v)", env, err)
		}
	}
}
