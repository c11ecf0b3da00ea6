package fleet

import "fmt"

// UsageError is a mistake in the command line (a flag's value, flags
// that do not go together) rather than in what a run did.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func usagef(format string, args ...any) error {
	return &UsageError{fmt.Errorf(format, args...)}
}
