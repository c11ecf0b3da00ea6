package auth

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/devicegate/devicegate/devicelimit"
)

// Role says what an account may do once connected.
type Role uint8

const (
	// RoleDevice publishes under its own topic prefix and subscribes to
	// its own command topics; its publishes count against its quota.
	RoleDevice Role = iota
	// RoleConsumer is a backend account: it may subscribe to any topic
	// and publish to none.
	RoleConsumer
)

// String returns "device" or "consumer".
func (r Role) String() string {
	if r == RoleConsumer {
		return "consumer"
	}
	return "device"
}

// ParseRole accepts "device" and "consumer".
func ParseRole(s string) (Role, error) {
	switch s {
	case "device":
		return RoleDevice, nil
	case "consumer":
		return RoleConsumer, nil
	}
	return 0, fmt.Errorf("%w: role must be device or consumer (got %q)", ErrInvalidCredentials, s)
}

// MaxFileSize bounds a credentials file.
const MaxFileSize = 64 << 20

// maxNameLen bounds usernames and client-ID patterns: MQTT strings are
// at most 65535 bytes.
const maxNameLen = 65535

// Entry is one account of a credentials file.
type Entry struct {
	Username string
	// Hash is the password's bcrypt or argon2id hash (HashPassword).
	Hash string
	Role Role
	// ClientIDs are the globs ('*', '?', '\' escapes) of the client IDs
	// the account may connect as; empty means exactly the username.
	ClientIDs []string
}

// Line formats e as a line of a credentials file (without newline):
//
//	username:hash:role:pattern,pattern
func (e Entry) Line() string {
	return e.Username + ":" + e.Hash + ":" + e.Role.String() + ":" + strings.Join(e.ClientIDs, ",")
}

// Validate checks that e can be written to and read from a file.
func (e Entry) Validate() error {
	if err := checkName("username", e.Username); err != nil {
		return err
	}
	if _, err := parseHash(e.Hash); err != nil {
		return fmt.Errorf("%w: user %q: hash %s", ErrInvalidCredentials, e.Username, err)
	}
	if e.Role != RoleDevice && e.Role != RoleConsumer {
		return fmt.Errorf("%w: user %q: unknown role %d", ErrInvalidCredentials, e.Username, e.Role)
	}
	for _, p := range e.ClientIDs {
		if err := checkName("client-ID pattern", p); err != nil {
			return err
		}
		if _, err := devicelimit.CompileGlob(p); err != nil {
			return fmt.Errorf("%w: user %q: client-ID pattern %q: %v", ErrInvalidCredentials, e.Username, p, err)
		}
	}
	return nil
}

// checkName refuses what the file format cannot hold: the separators
// ':' and ',', white space, control characters and invalid UTF-8 (MQTT
// strings are UTF-8 without NUL).
func checkName(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrInvalidCredentials, what)
	case len(s) > maxNameLen:
		return fmt.Errorf("%w: %s longer than %d bytes", ErrInvalidCredentials, what, maxNameLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrInvalidCredentials, what, s)
	case strings.ContainsAny(s, ":,") || strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Errorf("%w: %s %q contains ':', ',', white space or a control character", ErrInvalidCredentials, what, s)
	}
	return nil
}

// EscapeGlob returns the glob that matches exactly s.
func EscapeGlob(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c == '*' || c == '?' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// ParseFile reads a credentials file: one account per line,
// "username:hash:role:patterns", with blank lines and lines starting
// with '#' ignored. Errors name the line. A username appearing twice is
// an error.
func ParseFile(r io.Reader) ([]Entry, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%w: file larger than %d bytes", ErrInvalidCredentials, MaxFileSize)
	}
	var out []Entry
	seen := make(map[string]int)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, MaxFileSize+1)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if prev, dup := seen[e.Username]; dup {
			return nil, fmt.Errorf("line %d: %w: user %q is also on line %d", n, ErrInvalidCredentials, e.Username, prev)
		}
		seen[e.Username] = n
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	return out, nil
}

func parseLine(line string) (Entry, error) {
	f := strings.Split(line, ":")
	if len(f) != 4 {
		return Entry{}, fmt.Errorf("%w: want username:hash:role:client-id-patterns (%d fields, want 4)", ErrInvalidCredentials, len(f))
	}
	role, err := ParseRole(f[2])
	if err != nil {
		return Entry{}, err
	}
	e := Entry{Username: f[0], Hash: f[1], Role: role}
	if f[3] != "" {
		e.ClientIDs = strings.Split(f[3], ",")
	}
	if err := e.Validate(); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// FormatFile writes entries as a credentials file.
func FormatFile(w io.Writer, entries []Entry) error {
	bw := bufio.NewWriter(w)
	bw.WriteString("# devicegate credentials: username:hash:role:client-id-patterns (edit with \"gateway passwd\")\n")
	for _, e := range entries {
		bw.WriteString(e.Line())
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// Put adds e to the credentials file at path, or replaces the entry of
// the same username, keeping the others in order. It writes a temporary
// file (mode 0600) in the same directory, syncs it and renames it over
// path, so readers see the old file or the new one, never a mix. A
// missing file is created. A file that does not parse is left alone.
func Put(path string, e Entry) error {
	if err := e.Validate(); err != nil {
		return err
	}
	var entries []Entry
	f, err := os.Open(path)
	switch {
	case err == nil:
		entries, err = ParseFile(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("credentials file %s: %w", path, err)
		}
	case !os.IsNotExist(err):
		return fmt.Errorf("credentials file: %w", err)
	}
	if i := slices.IndexFunc(entries, func(x Entry) bool { return x.Username == e.Username }); i >= 0 {
		entries[i] = e
	} else {
		entries = append(entries, e)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("credentials file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("credentials file: %w", err)
	}
	if err := FormatFile(tmp, entries); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("credentials file: %w", err)
	}
	return nil
}

// Credentials are the accounts of a credentials file, ready to check
// logins. It is safe for concurrent use.
type Credentials struct {
	users map[string]*user
	// key keys the digests of verified passwords kept in memory.
	key [32]byte
}

type user struct {
	hash      hash
	role      Role
	clientIDs []devicelimit.Glob // one exact match of the username when the file lists none
	// verified is the keyed digest of the password last verified, so
	// that a reconnecting device costs an HMAC, not another bcrypt or
	// argon2id run. A wrong password never gets here.
	verified atomic.Pointer[[sha256.Size]byte]
}

// LoadFile reads and checks the credentials file at path. A file that
// anyone may write is refused: anyone on the host could add an account.
func LoadFile(path string) (*Credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("credentials file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("credentials file: %w", err)
	}
	if m := fi.Mode().Perm(); m&0o002 != 0 {
		return nil, fmt.Errorf("%w: credentials file %s is writable by anyone (mode %v), who could add an account: chmod 600 it",
			ErrInvalidCredentials, path, m)
	}
	entries, err := ParseFile(f)
	if err != nil {
		return nil, fmt.Errorf("credentials file %s: %w", path, err)
	}
	return New(entries)
}

// New builds Credentials from entries, which must be valid.
func New(entries []Entry) (*Credentials, error) {
	c := &Credentials{users: make(map[string]*user, len(entries))}
	if _, err := rand.Read(c.key[:]); err != nil {
		return nil, fmt.Errorf("credentials key: %w", err)
	}
	for _, e := range entries {
		if err := e.Validate(); err != nil {
			return nil, err
		}
		h, _ := parseHash(e.Hash)
		u := &user{hash: h, role: e.Role}
		pats := e.ClientIDs
		if len(pats) == 0 {
			pats = []string{EscapeGlob(e.Username)}
		}
		for _, p := range pats {
			g, _ := devicelimit.CompileGlob(p)
			u.clientIDs = append(u.clientIDs, g)
		}
		c.users[e.Username] = u
	}
	return c, nil
}

// Len returns the number of accounts.
func (c *Credentials) Len() int { return len(c.users) }

// Login results of Credentials.Check.
type Login uint8

const (
	// LoginOK: the password is right and the client ID is allowed.
	LoginOK Login = iota
	// LoginBadPassword: the wrong password.
	LoginBadPassword
	// LoginUnknownUser: no such user. Tell the client the same as for a
	// bad password.
	LoginUnknownUser
	// LoginClientIDNotAllowed: the password is right but the account
	// may not use this client ID.
	LoginClientIDNotAllowed
	// LoginBusy: too many password checks are running or waiting; the
	// password was not checked. Tell the client to retry later.
	LoginBusy
)

// Check verifies username and password and whether the account may
// connect as clientID; it returns the account's role with LoginOK. An
// unknown user is answered at once, without hashing: a prober learns
// which usernames exist, which device client IDs tell anyway, and a
// flood of made-up usernames costs no CPU.
func (c *Credentials) Check(username string, password []byte, clientID string) (Role, Login) {
	u := c.users[username]
	if u == nil {
		return 0, LoginUnknownUser
	}
	mac := hmac.New(sha256.New, c.key[:])
	mac.Write(password)
	var digest [sha256.Size]byte
	mac.Sum(digest[:0])
	if v := u.verified.Load(); v == nil || !hmac.Equal(v[:], digest[:]) {
		ok, err := u.hash.verify(password)
		if err != nil {
			return 0, LoginBusy
		}
		if !ok {
			return 0, LoginBadPassword
		}
		u.verified.Store(&digest)
	}
	for _, g := range u.clientIDs {
		if g.Match(clientID) {
			return u.role, LoginOK
		}
	}
	return u.role, LoginClientIDNotAllowed
}
