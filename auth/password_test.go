package auth

import (
	"errors"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadPassword: the first line without its line end; empty, too
// long and unreadable input are errors saying so.
func TestReadPassword(t *testing.T) {
	for in, want := range map[string]string{"s3cret\n": "s3cret", "s3cret\r\nmore\n": "s3cret", "no newline": "no newline", strings.Repeat("x", MaxPassword) + "\n": strings.Repeat("x", MaxPassword)} {
		if got, err := ReadPassword(strings.NewReader(in)); err != nil || got != want {
			t.Errorf("ReadPassword(%.20q) = %.20q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "\n", "\r\n"} {
		if _, err := ReadPassword(strings.NewReader(in)); !errors.Is(err, ErrEmptyPassword) {
			t.Errorf("ReadPassword(%q) = %v, want ErrEmptyPassword", in, err)
		}
	}
	if _, err := ReadPassword(strings.NewReader(strings.Repeat("x", MaxPassword+1) + "\n")); !errors.Is(err, ErrPasswordTooLong) || err.Error() != "password longer than 65535 bytes, the most an MQTT CONNECT carries" {
		t.Errorf("too long: %v", err)
	}
	if _, err := ReadPassword(iotest.ErrReader(errors.New("disk gone"))); err == nil || err.Error() != "read password: disk gone" {
		t.Errorf("unreadable: %v", err)
	}
}
