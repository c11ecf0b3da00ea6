package fleet

import "syscall"

// childAttr makes a child gateway die with the simulator, so that an
// interrupted run leaves no gateway behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
