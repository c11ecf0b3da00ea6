package cluster

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// batchMax bounds the devices of one script call: a call holds Redis for
// about 2 µs a device.
const batchMax = 1000

// batchTimeout is the time a script call over n devices is given on top
// of timeout.
func batchTimeout(timeout time.Duration, n int) time.Duration {
	return timeout + time.Duration(n)*20*time.Microsecond
}

// many runs script s over keys through c, each key's reply its own: one
// call where one Redis server holds every key (o.multi), else one call
// per key, pipelined (each key in its own slot on Redis Cluster). The
// script's ARGV are common, then per (len(args)/len(keys)) arguments of
// each key in turn; it returns an array of one reply per key.
func (o *Owner) many(ctx context.Context, c redis.UniversalClient, s *redis.Script, keys []string, common, args []any) ([]any, []error) {
	out := make([]any, len(keys))
	errs := make([]error, len(keys))
	if len(keys) == 0 {
		return out, errs
	}
	per := len(args) / len(keys)
	if o.multi {
		all := make([]any, 0, len(common)+len(args))
		all = append(append(all, common...), args...)
		v, err := s.Run(ctx, c, keys, all...).Slice()
		if err == nil && len(v) != len(keys) {
			err = errBadReply
		}
		for i := range keys {
			if errs[i] = err; err == nil {
				out[i] = v[i]
			}
		}
		return out, errs
	}
	argv := func(i int) []any {
		a := make([]any, 0, len(common)+per)
		return append(append(a, common...), args[i*per:(i+1)*per]...)
	}
	cmds := evalEach(ctx, c, s, len(keys), func(i int) []string { return keys[i : i+1] }, argv)
	for i, cmd := range cmds {
		v, err := cmd.Slice()
		if err == nil && len(v) != 1 {
			err = errBadReply
		}
		if errs[i] = err; err == nil {
			out[i] = v[0]
		}
	}
	return out, errs
}

// evalEach runs script s n times through c, call i on keys(i) with
// argv(i), pipelined (EVALSHA); a call a node answers NOSCRIPT (it
// restarted or flushed its scripts) is run again there with EVAL. Each
// command carries its own error.
func evalEach(ctx context.Context, c redis.UniversalClient, s *redis.Script, n int, keys func(int) []string, argv func(int) []any) []*redis.Cmd {
	pipe := c.Pipeline()
	cmds := make([]*redis.Cmd, n)
	for i := range n {
		cmds[i] = s.EvalSha(ctx, pipe, keys(i), argv(i)...)
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && isNoScript(err) {
			cmds[i] = s.Run(ctx, c, keys(i), argv(i)...)
		}
	}
	return cmds
}

// chunks calls f on the successive parts of n items of at most batchMax.
func chunks(n int, f func(lo, hi int)) {
	for lo := 0; lo < n; lo += batchMax {
		f(lo, min(lo+batchMax, n))
	}
}
