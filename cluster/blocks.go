package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/devicelimit"
)

// Blocks shares automatic blocks among the gateways of a cluster: a
// block is a key PREFIX "b:{DEVICE}" holding the block's end (ticks, in
// decimal), expiring with it, so a block made on one gateway refuses the
// device's CONNECTs on every other, and one lifted on any is lifted on
// all.
type Blocks struct {
	rdb     redis.UniversalClient
	prefix  string
	timeout time.Duration
}

// NewBlocks shares blocks in rdb under prefix (the Limiter's); a look
// waits at most timeout for Redis.
func NewBlocks(rdb redis.UniversalClient, prefix string, timeout time.Duration) *Blocks {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Blocks{rdb: rdb, prefix: prefix, timeout: timeout}
}

func (b *Blocks) key(device string) string { return b.prefix + "b:{" + device + "}" }

// Set shares device's block until until (at now, on the gateway's
// clock: the key expires with the block).
func (b *Blocks) Set(device string, until, now devicelimit.Tick) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*b.timeout)
	defer cancel()
	ttl := max(until.Sub(now), time.Millisecond)
	if err := b.rdb.Set(ctx, b.key(device), strconv.FormatInt(int64(until), 10), ttl).Err(); err != nil {
		return fmt.Errorf("share the block of %q in redis: %w", device, err)
	}
	return nil
}

// Delete lifts device's shared block.
func (b *Blocks) Delete(device string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*b.timeout)
	defer cancel()
	if err := b.rdb.Del(ctx, b.key(device)).Err(); err != nil {
		return fmt.Errorf("lift the block of %q in redis: %w", device, err)
	}
	return nil
}

// Until returns the end of device's shared block (ok false: none), or
// an error when Redis does not answer in time.
func (b *Blocks) Until(device string) (devicelimit.Tick, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	v, err := b.rdb.Get(ctx, b.key(device)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("block of %q in redis: %q is not a time", device, v)
	}
	return devicelimit.Tick(n), true, nil
}
