package fleet

import (
	"syscall"
	"time"
)

// childrenCPU returns the CPU time (user and system) of this process's
// children that have ended and been waited for: the simulator shares of
// a phase once it ended, and a gateway killed during it.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
