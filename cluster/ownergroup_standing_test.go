package cluster

import (
	"testing"

	"github.com/devicegate/devicegate/cluster/redistest"
)

// TestOwnerGroupStandingCommandsPerMessage is
// TestOwnerGroupCommandsPerMessage with every message's standing asked
// after its decision (an MQTT 5 device's QoS 1 publish, whatever its
// feedback mode): the group's standing comes from what the gateway's
// last claim or look said, so it stays within 0.05 Redis commands per
// admitted message (the grant script's GET and TIME counted).
func TestOwnerGroupStandingCommandsPerMessage(t *testing.T) {
	srv := redistest.Start(t)
	groupCommands(t, [2]*Owner{grantOwner(t, srv, 10).o, grantOwner(t, srv, 10).o}, true, func() int64 { return commandCount(t, srv) })
}
