package fleet

import "syscall"

// RaiseFileLimit raises the soft limit on open files to the hard limit:
// a simulated device holds a socket, and an embedded gateway one more
// per device, so a large fleet needs more than the usual 1024. Children
// inherit it. It
// returns the limit now in force.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return lim.Cur, nil
}
