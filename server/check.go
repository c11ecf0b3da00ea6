package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/persist"
)

// Check does what Start does with cfg before it opens the data file and
// binds the listeners: builds the quota table and resolver, reads the
// TLS certificates and keys, the credentials file and the forward
// destinations' secrets. It returns every problem (joined), each naming
// its key; it opens no port and no data file. `gateway check` runs it
// after Validate.
func Check(cfg config.Config) error {
	var errs []error
	if _, err := cfg.Table(); err != nil {
		errs = append(errs, fmt.Errorf("limits.buckets: %w", err))
	}
	if _, err := cfg.Resolver(); err != nil {
		errs = append(errs, err)
	}
	if _, err := cfg.Identity(); err != nil {
		errs = append(errs, fmt.Errorf("limits.identity: %w", err))
	}
	if _, err := persist.ParseCheckMode(cfg.Persist.CheckOnStart); err != nil {
		errs = append(errs, fmt.Errorf("persist.check_on_start: %w", err))
	}
	if _, err := loadSecurity(cfg); err != nil {
		errs = append(errs, err)
	}
	if a := cfg.Admin.TLS; a.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(a.CertFile, a.KeyFile); err != nil {
			errs = append(errs, fmt.Errorf("admin.tls: %w", err))
		}
	}
	discard := slog.New(slog.DiscardHandler)
	for i, fc := range cfg.Forward {
		if _, err := dialers(fc, "", nil, discard); err != nil {
			errs = append(errs, fmt.Errorf("forward[%d].%w", i, err))
		}
	}
	return errors.Join(errs...)
}
