//go:build !unix

package main

import "errors"

// execSelf is not available here: the process keeps the runtime's
// default of shrinking stacks.
func execSelf([]string) error {
	return errors.New("no exec on this system")
}
