package config

import (
	"errors"
	"fmt"
)

// FieldError is a problem with the value of one key. Parse and Validate
// return them, joined with errors.Join when there are several; use
// errors.As to find the keys.
type FieldError struct {
	// Key is the full key, such as "limits.rules[0].quota.window"; ""
	// for the document itself.
	Key string
	// Line is the line of the value in the file, or 0 when unknown
	// (Validate works on values, not files).
	Line int
	// Msg says what is wrong and shows the value.
	Msg string
}

// Error formats the problem as "line 3: limits.buckets: must be ...",
// without the line when it is unknown.
func (e *FieldError) Error() string {
	key := e.Key
	if key == "" {
		key = "top level"
	}
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s: %s", e.Line, key, e.Msg)
	}
	return key + ": " + e.Msg
}

// FieldErrors returns the FieldErrors in err's tree, in order.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var visit func(error)
	visit = func(err error) {
		switch u := err.(type) {
		case *FieldError:
			out = append(out, u)
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				visit(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				visit(e)
			}
		}
	}
	if err != nil {
		visit(err)
	}
	return out
}

func joinErrors(errs []error, dropped int) error {
	if dropped > 0 {
		errs = append(errs, fmt.Errorf("... and %d more problems", dropped))
	}
	return errors.Join(errs...)
}
