package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/config"
)

// go-redis writes lines of its own (a connection pool that cannot dial,
// a pub/sub reconnect) through one process-wide logger, to stderr and
// unstructured: "redis: 2026/11/26 09:34:26 pool.go:770: redis:
// connection pool: failed to dial after 5 attempts: ...". A gateway that
// uses Redis (cluster.redis, a redis:// forward) routes them into its
// own log: msg "redis client", level warn, component redis, the line in
// "line"; at most one per redisLogEvery, the lines left out counted in
// the next one's "suppressed". The logger is the process's: in a
// process running several gateways (tests) the last one started gets
// the lines.

// redisLogEvery is the least time between two go-redis lines logged.
const redisLogEvery = time.Second

// usesRedis reports whether cfg has the gateway talk to Redis.
func usesRedis(cfg config.Config) bool {
	if cfg.Cluster.Enabled() {
		return true
	}
	for _, fc := range cfg.Forward {
		if fc.Kind() == "redis" {
			return true
		}
	}
	return false
}

// redisLog is a go-redis logger writing to a slog.Logger.
type redisLog struct {
	log *slog.Logger
	now func() time.Time

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// routeRedisLog makes log the destination of go-redis's own lines.
func routeRedisLog(log *slog.Logger) {
	redis.SetLogger(newRedisLog(log))
}

func newRedisLog(log *slog.Logger) *redisLog {
	return &redisLog{log: log, now: time.Now}
}

// Printf logs one go-redis line as msg "redis client" with the line in
// "line", unless one was logged less than redisLogEvery ago.
func (r *redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.mu.Lock()
	now := r.now()
	if !r.last.IsZero() && now.Sub(r.last) < redisLogEvery {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	line := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	if suppressed > 0 {
		r.log.WarnContext(ctx, "redis client", "component", "redis", "line", line, "suppressed", suppressed)
		return
	}
	r.log.WarnContext(ctx, "redis client", "component", "redis", "line", line)
}
