package admin

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/devicegate/devicegate/auth"
)

// TokenEnv is the environment variable LoadOrCreateToken reads.
const TokenEnv = "GATEWAY_ADMIN_TOKEN"

// TokenFile is the name of the token file in the data directory.
const TokenFile = "admin.token"

// LoadOrCreateToken returns the admin API token and where it came from.
// A configured (non-empty) token wins; else the environment variable
// GATEWAY_ADMIN_TOKEN; else the file dataDir/admin.token when it exists,
// which must be non-empty and readable by its owner only (mode 0600 or
// stricter); else a new random token (32 bytes, hex-encoded) written to
// that file with mode 0600, and created reports true. path is the file's
// path when the token came from or went to the file, "" otherwise.
// Callers log the path, never the token.
func LoadOrCreateToken(configured, dataDir string) (token, path string, created bool, err error) {
	if configured != "" {
		return configured, "", false, nil
	}
	if env := os.Getenv(TokenEnv); env != "" {
		if err := auth.CheckBearerToken(env); err != nil {
			return "", "", false, fmt.Errorf("admin token: %s %w", TokenEnv, err)
		}
		return env, "", false, nil
	}
	if dataDir == "" {
		return "", "", false, errors.New("admin token: none configured, " + TokenEnv + " unset, and no data directory to keep one in")
	}
	path = filepath.Join(dataDir, TokenFile)
	token, err = readTokenFile(path)
	if err == nil {
		return token, path, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", path, false, err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", path, false, fmt.Errorf("admin token: generate: %w", err)
	}
	token = hex.EncodeToString(raw[:])
	if err := writeTokenFile(dataDir, path, token); err != nil {
		return "", path, false, err
	}
	return token, path, true, nil
}

func readTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return "", fmt.Errorf("admin token: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("admin token file %q is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("admin token file %q has mode %04o: others can read it; run chmod 600 %q (and consider replacing the token)", path, perm, path)
	}
	b := make([]byte, 4096)
	n, err := f.Read(b)
	if err != nil && n == 0 {
		return "", fmt.Errorf("admin token file %q is empty", path)
	}
	tok := strings.TrimSpace(string(b[:n]))
	if tok == "" {
		return "", fmt.Errorf("admin token file %q is empty", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("admin token file %q holds more than one line or word", path)
	}
	if err := auth.CheckBearerToken(tok); err != nil {
		return "", fmt.Errorf("admin token file %q: the token %w", path, err)
	}
	return tok, nil
}

// writeTokenFile creates the file exclusively, so two processes never
// overwrite each other's token, and syncs it before returning.
func writeTokenFile(dir, path, token string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("admin token: create: %w", err)
	}
	if _, err := f.WriteString(token + "\n"); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("admin token: write %q: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("admin token: sync %q: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("admin token: close %q: %w", path, err)
	}
	return nil
}
