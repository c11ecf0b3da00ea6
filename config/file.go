package config

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// ReadFile parses the YAML configuration file at path; its errors name
// the file.
func ReadFile(path string) (Config, error) {
	file, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	defer file.Close()
	cfg, err := Parse(file)
	if err != nil {
		return Config{}, Prefix("config "+path, err)
	}
	return cfg, nil
}

// NameFlags rewrites the problems of err whose key a command-line flag
// set so that they name the flag: "--limit: must be between 1 and
// 1000000000 (got 0)". byKey maps a key ("limits.default.limit") to its
// flag's name ("limit").
func NameFlags(err error, byKey map[string]string) error {
	var list []error
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		list = u.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		var fe *FieldError
		if errors.As(e, &fe) {
			if name, ok := byKey[fe.Key]; ok {
				e = fmt.Errorf("--%s: %s", name, fe.Msg)
			}
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// Prefix prefixes err, putting several problems on lines of their own.
func Prefix(prefix string, err error) error {
	if strings.Contains(err.Error(), "\n") {
		return fmt.Errorf("%s:\n%w", prefix, err)
	}
	return fmt.Errorf("%s: %w", prefix, err)
}
