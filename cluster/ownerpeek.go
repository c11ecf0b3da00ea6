package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/devicelimit"
)

// PeekAll returns the verdict a message of size bytes of device in
// class would get under the windows ls, changing nothing: from this
// gateway's table when it owns the device, else from the owner's last
// checkpoint in Redis (behind the owner's table by at most one lease:
// what it admitted since). A device no gateway has decided for yet has
// empty windows.
func (o *Owner) PeekAll(ctx context.Context, device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error) {
	if err := devicelimit.ValidateLimits(ls, o.Buckets()); err != nil {
		return devicelimit.Verdict{}, err
	}
	if o.Owns(device) {
		return o.table.PeekAllAt(device, class, ls, size, now), nil
	}
	c, err := o.ctl.HGet(ctx, o.recordKey(device), "c").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return devicelimit.Verdict{}, fmt.Errorf("read the checkpoint of %q in redis: %w", device, err)
	}
	saved, err := decodeCheckpoint(c)
	if err != nil {
		return devicelimit.Verdict{}, fmt.Errorf("checkpoint of %q: %w", device, err)
	}
	scratch, err := devicelimit.NewTable(o.Buckets())
	if err != nil {
		return devicelimit.Verdict{}, err
	}
	for _, sw := range saved {
		if sw.has && sw.class == class {
			if err := scratch.Restore(sw.key(device), sw.w); err != nil {
				return devicelimit.Verdict{}, fmt.Errorf("checkpoint of %q: %w", device, err)
			}
		}
	}
	return scratch.PeekAllAt(device, class, ls, size, now), nil
}

// Reset empties the device's windows in this gateway's table, when it
// owns the device, and reports whether it had any. (A gateway that
// does not own the device cannot reach the owner's table: the admin
// API's reset is for the gateway the device is on.)
func (o *Owner) Reset(device string) bool {
	if !o.Owns(device) {
		return false
	}
	return o.table.Reset(device)
}
