package auth

import (
	"errors"
	"strings"
)

// CheckBearerToken returns why no request could ever present tok as its
// bearer token, or nil. The admin API trims the token a request sends and
// takes it from one header line, so a token with white space at either
// end or a control character could never match. The error leaves the
// secret out. An empty token is the caller's to judge.
func CheckBearerToken(tok string) error {
	if strings.TrimSpace(tok) != tok {
		return errors.New("must not begin or end with white space (no request could send it)")
	}
	if strings.ContainsFunc(tok, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
		return errors.New("must not contain control characters (no request could send it)")
	}
	return nil
}
