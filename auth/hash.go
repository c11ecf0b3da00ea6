package auth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
)

// Hash algorithms for HashPassword.
const (
	Bcrypt   = "bcrypt"
	Argon2id = "argon2id"
)

// Argon2id parameters of new hashes: RFC 9106's second recommended
// option (64 MiB, 3 passes) is costly for a gateway verifying a
// reconnect storm, so these are OWASP's lower-memory equivalent.
const (
	argonTime    = 2
	argonMemory  = 19 * 1024 // KiB
	argonThreads = 1
	argonKeyLen  = 32
	argonSaltLen = 16
)

// Bounds a stored hash must keep, so that a crafted file cannot make one
// verification take minutes or gigabytes. (bcrypt doubles its work with
// each cost step: 16 is 64 times the default 10, seconds per check; 31,
// which bcrypt accepts, would be a day.)
const (
	maxBcryptCost  = 16
	maxArgonMemory = 1 << 20 // KiB: 1 GiB
	maxArgonTime   = 64
	minArgonSalt   = 8
	minArgonKey    = 16
	maxArgonKey    = 64
)

// HashPassword hashes password with algo (Bcrypt at bcrypt.DefaultCost,
// or Argon2id) into the string stored in a credentials file.
func HashPassword(algo string, password []byte) (string, error) {
	switch algo {
	case Bcrypt:
		if len(password) > 72 {
			return "", fmt.Errorf("%w: bcrypt takes passwords of at most 72 bytes (got %d); use argon2id", ErrInvalidCredentials, len(password))
		}
		h, err := bcrypt.GenerateFromPassword(password, bcrypt.DefaultCost)
		if err != nil {
			return "", fmt.Errorf("bcrypt: %w", err)
		}
		return string(h), nil
	case Argon2id:
		salt := make([]byte, argonSaltLen)
		if _, err := rand.Read(salt); err != nil {
			return "", fmt.Errorf("argon2id salt: %w", err)
		}
		key := argon2.IDKey(password, salt, argonTime, argonMemory, argonThreads, argonKeyLen)
		return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
			b64.EncodeToString(salt), b64.EncodeToString(key)), nil
	}
	return "", fmt.Errorf("%w: unknown hash algorithm %q (want bcrypt or argon2id)", ErrInvalidCredentials, algo)
}

var b64 = base64.RawStdEncoding

// hash is a parsed password hash.
type hash struct {
	bcrypt []byte // the whole bcrypt hash, or nil for argon2id
	// argon2id
	memory    uint32
	time      uint32
	threads   uint8
	salt, key []byte
}

// parseHash checks a stored hash: bcrypt ($2a$, $2b$, $2y$) or argon2id
// in the PHC string format. Plain text is refused.
func parseHash(s string) (hash, error) {
	switch {
	case strings.HasPrefix(s, "$2a$") || strings.HasPrefix(s, "$2b$") || strings.HasPrefix(s, "$2y$"):
		cost, err := bcrypt.Cost([]byte(s))
		if err != nil || len(s) != 60 {
			return hash{}, fmt.Errorf("not a valid bcrypt hash")
		}
		if cost > maxBcryptCost {
			return hash{}, fmt.Errorf("not a usable bcrypt hash: cost must be 4..%d (got %d)", maxBcryptCost, cost)
		}
		return hash{bcrypt: []byte(s)}, nil
	case strings.HasPrefix(s, "$argon2id$"):
		return parseArgon(s)
	}
	return hash{}, fmt.Errorf("not a bcrypt or argon2id hash (plain-text passwords are not accepted; use \"gateway passwd\")")
}

func parseArgon(s string) (hash, error) {
	bad := func(what string) (hash, error) { return hash{}, fmt.Errorf("not a valid argon2id hash: %s", what) }
	parts := strings.Split(s, "$") // "", "argon2id", "v=19", "m=..,t=..,p=..", salt, key
	if len(parts) != 6 {
		return bad("want $argon2id$v=19$m=M,t=T,p=P$SALT$KEY")
	}
	if parts[2] != "v="+strconv.Itoa(argon2.Version) {
		return bad("version must be v=" + strconv.Itoa(argon2.Version))
	}
	var h hash
	params := strings.Split(parts[3], ",")
	if len(params) != 3 {
		return bad("parameters must be m=M,t=T,p=P")
	}
	for i, name := range []string{"m", "t", "p"} {
		v, ok := strings.CutPrefix(params[i], name+"=")
		if !ok {
			return bad("parameters must be m=M,t=T,p=P")
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return bad("parameter " + name + " is not a number")
		}
		switch name {
		case "m":
			h.memory = uint32(n)
		case "t":
			h.time = uint32(n)
		case "p":
			if n < 1 || n > 255 {
				return bad("p must be 1..255")
			}
			h.threads = uint8(n)
		}
	}
	switch {
	case h.time < 1 || h.time > maxArgonTime:
		return bad(fmt.Sprintf("t must be 1..%d", maxArgonTime))
	case h.memory < 8*uint32(h.threads) || h.memory > maxArgonMemory:
		return bad(fmt.Sprintf("m must be 8*p..%d KiB", maxArgonMemory))
	}
	var err error
	if h.salt, err = b64.DecodeString(parts[4]); err != nil || len(h.salt) < minArgonSalt {
		return bad(fmt.Sprintf("salt must be unpadded base64 of at least %d bytes", minArgonSalt))
	}
	if h.key, err = b64.DecodeString(parts[5]); err != nil || len(h.key) < minArgonKey || len(h.key) > maxArgonKey {
		return bad(fmt.Sprintf("key must be unpadded base64 of %d..%d bytes", minArgonKey, maxArgonKey))
	}
	return h, nil
}

// verifySlots bounds the password checks that run at once, process-wide,
// to the CPUs that can run them: each argon2id check allocates the hash's
// memory cost (19 MiB by default, up to 1 GiB), so a flood of
// wrong-password CONNECTs checked all at once would grow the heap by that
// much per connection in flight. More checks at once would not finish
// sooner anyway; the others wait their turn.
var verifySlots = make(chan struct{}, runtime.GOMAXPROCS(0))

// verifyQueue counts the checks running or waiting for a slot; beyond
// maxVerifyQueue a check is not queued but answered busy, so a flood of
// CONNECTs with passwords cannot hold an unbounded number of connections
// waiting at CONNECT.
var verifyQueue atomic.Int64

// maxVerifyQueue is how many password checks may run or wait at once.
var maxVerifyQueue = int64(32 * runtime.GOMAXPROCS(0))

// errVerifyBusy is verify's answer when maxVerifyQueue checks are
// already running or waiting.
var errVerifyBusy = errors.New("too many password checks in progress")

// verify reports whether password matches h, in time independent of
// where they differ, or errVerifyBusy.
func (h hash) verify(password []byte) (bool, error) {
	if verifyQueue.Add(1) > maxVerifyQueue {
		verifyQueue.Add(-1)
		return false, errVerifyBusy
	}
	defer verifyQueue.Add(-1)
	verifySlots <- struct{}{}
	defer func() { <-verifySlots }()
	if h.bcrypt != nil {
		return bcrypt.CompareHashAndPassword(h.bcrypt, password) == nil, nil
	}
	key := argon2.IDKey(password, h.salt, h.time, h.memory, h.threads, uint32(len(h.key)))
	return subtle.ConstantTimeCompare(key, h.key) == 1, nil
}
