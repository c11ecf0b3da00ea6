package auth

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxPassword is the longest password an MQTT CONNECT can carry.
const MaxPassword = 65535

// ReadPassword's refusals of what it read: an empty first line, and
// one longer than MaxPassword.
var (
	ErrEmptyPassword   = errors.New("empty password on standard input")
	ErrPasswordTooLong = fmt.Errorf("password longer than %d bytes, the most an MQTT CONNECT carries", MaxPassword)
)

// ReadPassword reads a password as gateway passwd takes it: the first
// line of r, without its line end. It reads a little past MaxPassword,
// so that a longer password is refused rather than cut to a hash no
// device matches.
func ReadPassword(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, int64(MaxPassword+len("\r\n")+1))).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read password: %w", err)
	}
	password := strings.TrimRight(line, "\r\n")
	switch {
	case password == "":
		return "", ErrEmptyPassword
	case len(password) > MaxPassword:
		return "", ErrPasswordTooLong
	}
	return password, nil
}
