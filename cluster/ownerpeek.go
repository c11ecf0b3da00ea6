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

// Reset empties the device's windows in the owner's table and writes
// that to the device's checkpoint in Redis before it returns, so that
// neither a crash of this gateway nor a move of the device brings the
// old counts back. It reports whether the device had a window here.
//
// A device another gateway owns is taken over first, through the
// release request its owner answers as for a device that connected
// here (the owner writes its final windows and closes the device's
// session; the device reconnects and is claimed back with the emptied
// windows); a device without a record in Redis has no windows to reset.
// The checkpoint the reset writes carries no lease, so that a crash
// right after it charges the device nothing; the device's next
// admission waits for a checkpoint with a lease, as at its claim.
//
// An error wraps ErrResetNotWritten when the windows were emptied here
// but the checkpoint was not written (Redis failed, ctx ended, or
// another gateway took the device over meanwhile); otherwise nothing
// changed.
func (o *Owner) Reset(ctx context.Context, device string) (bool, error) {
	if !o.Owns(device) {
		n, err := o.ctl.Exists(ctx, o.recordKey(device)).Result()
		if err != nil {
			return false, fmt.Errorf("reset %q: read its record in redis: %w", device, err)
		}
		if n == 0 {
			return false, nil // no gateway decided for it: empty everywhere
		}
		if err := o.Claim(device); err != nil {
			return false, fmt.Errorf("reset %q: take it over from its owner: %w", device, err)
		}
	}
	sh := o.shard(device)
	sh.mu.RLock()
	d := sh.m[device]
	sh.mu.RUnlock()
	if d == nil {
		return false, fmt.Errorf("reset %q: %w", device, errClaimLost)
	}
	d.mu.Lock()
	if d.state != stReady {
		d.mu.Unlock()
		return false, fmt.Errorf("reset %q: %w", device, errClaimLost)
	}
	had := o.table.Reset(device)
	d.resets++
	r := d.resets
	d.leasedM, d.leasedB, d.ckErr = 0, 0, nil
	for {
		var err error
		switch {
		case d.durReset >= r:
			d.mu.Unlock()
			return had, nil
		case d.state != stReady:
			err = errClaimLost
		case d.ckErr != nil:
			err = d.ckErr
		case o.shared.health.skip():
			err = errResting
		}
		if err != nil {
			d.mu.Unlock()
			return had, fmt.Errorf("reset %q: %w: %w", device, ErrResetNotWritten, err)
		}
		o.enqueue(d, true)
		ch := d.landed
		d.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return had, fmt.Errorf("reset %q: %w: %w", device, ErrResetNotWritten, ctx.Err())
		}
		d.mu.Lock()
	}
}
