package broker

import (
	"log/slog"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Claimer is a Limiter that owns the devices it decides for
// (cluster.Owner): a device connecting here is claimed at once, so the
// gateway it was on gives it up and closes its session there (MQTT
// session takeover, cluster-wide). Server.CloseDevice is the other
// half: the owner calls it for a device another gateway claimed.
type Claimer interface {
	// ClaimSoon queues the device's claim and returns at once (the
	// claims of a connection storm go to Redis in batches).
	ClaimSoon(device string)
}

// claimHook claims each device as its session is established.
type claimHook struct {
	mqtt.HookBase
	c     Claimer
	conns *registry
	log   *slog.Logger
}

func (h *claimHook) ID() string { return "devicegate-cluster-claim" }

func (h *claimHook) Provides(b byte) bool { return b == mqtt.OnSessionEstablished }

// OnSessionEstablished queues the device's claim off the connect path:
// its first publish waits for the claim in the limiter (which logs a
// failed claim).
func (h *claimHook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if c := h.conns.info(cl); c != nil {
		h.c.ClaimSoon(c.device)
	}
}

// addClaimHook adds the claim hook when the limiter owns devices.
func addClaimHook(srv *mqtt.Server, l Limiter, conns *registry, log *slog.Logger) error {
	c, ok := l.(Claimer)
	if !ok {
		return nil
	}
	return srv.AddHook(&claimHook{c: c, conns: conns, log: log}, nil)
}

// CloseDevice disconnects every connection of device, with "session
// taken over": another gateway of the cluster took the device. It
// returns how many it closed.
func (s *Server) CloseDevice(device string) int {
	h := s.hook
	h.devMu.Lock()
	var ids []string
	if d := h.devices[device]; d != nil {
		for _, c := range d.live {
			ids = append(ids, c.clientID)
		}
	}
	h.devMu.Unlock()
	n := 0
	for _, id := range ids {
		if cl, ok := s.mqtt.Clients.Get(id); ok && !cl.Net.Inline && !cl.Closed() {
			_ = s.mqtt.DisconnectClient(cl, packets.ErrSessionTakenOver)
			n++
		}
	}
	return n
}
