package fleet

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisStats are a Redis server's counters, summed over servers.
type RedisStats struct {
	// Commands counts every command Redis ran, as INFO commandstats
	// counts them: those run inside scripts (redis.call) included, the
	// INFO calls that read the counters excluded.
	Commands int64
	// CPU is used_cpu_sys plus used_cpu_user.
	CPU time.Duration
}

// Sub returns s minus o.
func (s RedisStats) Sub(o RedisStats) RedisStats {
	return RedisStats{Commands: s.Commands - o.Commands, CPU: s.CPU - o.CPU}
}

// Stats reads the counters of every server still running (a killed
// one counts no more).
func (r *Redis) Stats(ctx context.Context) RedisStats {
	var out RedisStats
	for i, addr := range r.Addrs {
		if r.Procs[i].Exited() {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 1})
		info, err := c.Info(ctx, "commandstats", "cpu").Result()
		c.Close()
		if err == nil {
			s := parseRedisInfo(info)
			out.Commands += s.Commands
			out.CPU += s.CPU
		}
	}
	return out
}

// parseRedisInfo reads INFO's commandstats and cpu sections.
func parseRedisInfo(info string) RedisStats {
	var s RedisStats
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(key, "cmdstat_") && key != "cmdstat_info":
			for _, f := range strings.Split(val, ",") {
				if n, ok := strings.CutPrefix(f, "calls="); ok {
					v, _ := strconv.ParseInt(n, 10, 64)
					s.Commands += v
				}
			}
		case key == "used_cpu_sys" || key == "used_cpu_user":
			v, _ := strconv.ParseFloat(val, 64)
			s.CPU += time.Duration(v * float64(time.Second))
		}
	}
	return s
}

// ProcStats are a running process's CPU time and resident memory, read
// from /proc.
type ProcStats struct {
	CPU time.Duration
	RSS int64 // bytes
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times on Linux.
const clockTick = 100

// ReadProcStats reads pid's CPU time (user and system) and resident set.
func ReadProcStats(pid int) (ProcStats, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcStats{}, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing one.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 22 {
		return ProcStats{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	rssPages, _ := strconv.ParseInt(f[21], 10, 64)
	return ProcStats{
		CPU: time.Duration(utime+stime) * time.Second / clockTick,
		RSS: rssPages * int64(os.Getpagesize()),
	}, nil
}
