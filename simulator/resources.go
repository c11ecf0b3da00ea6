package simulator

import (
	"syscall"
	"time"
)

// Resources are what the simulator's own process used in a run: its
// peak resident memory and its CPU time (user and system). With the
// gateway in the same process (gateway simulate --embedded) they are
// both's.
type Resources struct {
	PeakRSS int64         `json:"peak_rss_bytes"`
	CPU     time.Duration `json:"cpu_ns"`
}

// selfUsage reads this process's peak RSS and CPU time so far.
func selfUsage() Resources {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return Resources{}
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return Resources{PeakRSS: int64(ru.Maxrss) << 10, CPU: cpu} // Linux reports KiB
}
