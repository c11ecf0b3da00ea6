package fleet

import (
	"context"
	"fmt"
	"os"
	"sort"
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
	// ByCommand counts the calls per command ("evalsha", "get", ...).
	ByCommand map[string]int64
}

// Sub returns s minus o.
func (s RedisStats) Sub(o RedisStats) RedisStats {
	out := RedisStats{Commands: s.Commands - o.Commands, CPU: s.CPU - o.CPU, ByCommand: map[string]int64{}}
	for k, v := range s.ByCommand {
		if d := v - o.ByCommand[k]; d != 0 {
			out.ByCommand[k] = d
		}
	}
	return out
}

// add adds o to s.
func (s *RedisStats) add(o RedisStats) {
	s.Commands += o.Commands
	s.CPU += o.CPU
	if s.ByCommand == nil {
		s.ByCommand = map[string]int64{}
	}
	for k, v := range o.ByCommand {
		s.ByCommand[k] += v
	}
}

// Top returns the n commands called most, as "name calls".
func (s RedisStats) Top(n int) []string {
	names := make([]string, 0, len(s.ByCommand))
	for k := range s.ByCommand {
		names = append(names, k)
	}
	sort.Slice(names, func(a, b int) bool { return s.ByCommand[names[a]] > s.ByCommand[names[b]] })
	out := make([]string, 0, n)
	for _, k := range names[:min(n, len(names))] {
		out = append(out, fmt.Sprintf("%s %d", k, s.ByCommand[k]))
	}
	return out
}

// Stats reads the counters of every server, summed; a server no longer
// running counts with what it had at its last reading.
func (r *Redis) Stats(ctx context.Context) RedisStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = make([]RedisStats, len(r.Addrs))
	}
	var out RedisStats
	for i, addr := range r.Addrs {
		if !r.Procs[i].Exited() {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 1})
			info, err := c.Info(ctx, "commandstats", "cpu").Result()
			c.Close()
			if err == nil {
				r.last[i] = parseRedisInfo(info)
			}
		}
		out.add(r.last[i])
	}
	return out
}

// parseRedisInfo reads INFO's commandstats and cpu sections.
func parseRedisInfo(info string) RedisStats {
	s := RedisStats{ByCommand: map[string]int64{}}
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
					s.ByCommand[strings.TrimPrefix(key, "cmdstat_")] += v
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
