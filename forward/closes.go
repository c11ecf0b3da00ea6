package forward

import (
	"errors"
	"fmt"
	"time"
)

// What the forwarder does about a destination that ends connections
// after a message (dead_after_closes) and about one that stores messages
// ahead of an earlier one that failed (Stats.Reordered). pump.go calls
// these.

// ErrEnded is the error of an acknowledgement that never came because
// the connection ended (the destination closed it): the outcome is not
// known, and the message is sent again.
var ErrEnded = errors.New("the connection ended before the upstream acknowledged the message")

// closes counts the connections that ended, one after the other, while
// message seq was the oldest unacknowledged (Run's goroutine only).
type closes struct {
	seq uint64
	n   int
}

// closedAfter counts a connection that ended with message seq the
// oldest unacknowledged.
func (f *Forwarder) closedAfter(seq uint64) {
	if f.closes.seq != seq {
		f.closes = closes{seq: seq}
	}
	f.closes.n++
}

// setAsideClosing moves the oldest message to the dead letters, reason
// connection_closed, once DeadAfterCloses connections in a row ended
// with it the oldest unacknowledged (a destination that closes the
// connection instead of refusing it, or before its refusal is read),
// and reports whether it did.
func (f *Forwarder) setAsideClosing() bool {
	limit := f.cfg.DeadAfterCloses
	if limit <= 0 || f.closes.n < limit {
		return false
	}
	c := f.closes
	f.closes = closes{}
	err := f.deadLetter(c.seq, &RefusedError{Reason: "connection_closed",
		Err: fmt.Errorf("the upstream closed the connection %d times in a row with this message the oldest unacknowledged (dead_after_closes: %d)", c.n, limit)})
	if err != nil {
		f.slog.Error("message after which the upstream closes the connection not set aside", "seq", c.seq, "error", err)
		return false
	}
	return true
}

// countAhead counts, in Reordered, the messages of rest (sent after
// one that failed, on the same connection) that the destination
// acknowledged all the same: they were stored ahead of the failed one,
// which is sent again after them. It waits for their outcome until the
// acknowledgement timeout or the connection's end.
func (f *Forwarder) countAhead(c Conn, rest []inflight) {
	t := time.NewTimer(f.cfg.AckTimeout)
	defer t.Stop()
	waiting := true
	n := 0
	for _, s := range rest {
		if waiting {
			select {
			case <-s.ack.Done():
			case <-c.Lost():
				waiting = false
			case <-t.C:
				waiting = false
			}
		}
		if isDone(s.ack) && s.ack.Error() == nil {
			n++
		}
	}
	if n > 0 {
		f.reordered.Add(uint64(n))
		f.slog.Warn("messages stored by the upstream ahead of an earlier one that failed; it is sent again after them", "messages", n,
			"reordered_so_far", f.reordered.Load())
	}
}
