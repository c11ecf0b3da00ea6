package config

import (
	"io"
	"slices"

	"gopkg.in/yaml.v3"
)

// Redacted stands for a secret in Print's output.
const Redacted = "REDACTED"

// Print writes c as YAML with every key, the defaults filled in, in the
// form Parse reads; the secrets written in the file (admin.token,
// cluster.redis.password, forward[].password) are shown as REDACTED.
func (c Config) Print(w io.Writer) error {
	redact := func(s *string) {
		if *s != "" {
			*s = Redacted
		}
	}
	redact(&c.Admin.Token)
	redact(&c.Cluster.Redis.Password)
	c.Forward = slices.Clone(c.Forward)
	for i := range c.Forward {
		redact(&c.Forward[i].Password)
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return err
	}
	return enc.Close()
}
