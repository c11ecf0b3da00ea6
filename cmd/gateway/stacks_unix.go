//go:build unix

package main

import (
	"os"
	"syscall"
)

// execSelf replaces the process with a fresh start of the same
// executable and arguments under env.
func execSelf(env []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	return syscall.Exec(exe, os.Args, env)
}
