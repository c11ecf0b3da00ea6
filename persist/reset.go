package persist

import "fmt"

// Reset empties device's windows in the table (devicelimit.Table.Reset)
// and writes that to the data file before it returns, so that a crash
// after it cannot bring their counts back: it takes a snapshot, which
// deletes the windows and, in the same transaction, drops the counts
// their lease writes hold and closes their leases, as any snapshot that
// deletes a window does (leaseTx.merge): a crash charges them nothing,
// and a lease write taken before the reset that commits after it
// changes neither. That snapshot also writes whatever else changed
// since the last one: at most one snapshot interval's changes, which
// the next snapshot would have written anyway.
//
// It reports whether the device had a window. On error the windows
// are emptied in memory but the data file may still hold their counts:
// the next snapshot writes the deletion, and a crash before it can
// bring them back. A reset of a device without a window writes what a
// failed reset left pending, so that its success says the device's
// windows are empty on disk too.
//
// After Close (the gateway is stopping: no snapshot follows) it changes
// nothing and returns an error wrapping ErrClosed.
func (sn *Snapshotter) Reset(device string) (bool, error) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.closed {
		return false, fmt.Errorf("reset %q: %w", device, ErrClosed)
	}
	had := sn.table.Reset(device)
	if _, err := sn.snapshot(false); err != nil {
		return had, fmt.Errorf("reset %q: %w", device, err)
	}
	return had, nil
}
