package broker

import (
	"errors"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// leaseWait bounds how long an admission waits for its lease to be
// durable (devicelimit.Table.EnableLeases) before it is given up
// unacknowledged, like a publish the forward log could not take: the
// data file is failing.
const leaseWait = 5 * time.Second

// errLease is the failure of an admission whose lease did not become
// durable in time.
var errLease = errors.New("the data file did not record the device's lease in time")

// leased waits until the lease an admission needs (Decision.Lease) is
// durable, and reports whether it is: only then may the admission be
// acted on (acked, forwarded, delivered). t nil or without leases: at
// once.
func leased(t *devicelimit.Table, gen uint32) bool {
	if gen == 0 || t == nil || t.LeaseDurable(gen) {
		return true
	}
	return t.WaitLease(gen, leaseWait)
}
