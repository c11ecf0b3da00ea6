//go:build !linux

package fleet

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }
