package admin

import (
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// NextMessage is what a device's next message, in one topic class,
// would get now, decided by the broker's own tests (broker.Next).
type NextMessage struct {
	Class      string
	Outcome    string // admitted, refused, deferred, would_refuse, blocked
	By         string // window, group, queue, queue full, block; "" when admitted
	RetryAfter time.Duration
	Queued     int
}

// NextJSON is a NextMessage in GET /api/v1/devices/{id}'s "next".
type NextJSON struct {
	Class      string `json:"class,omitempty"`
	Outcome    string `json:"outcome"`
	By         string `json:"by,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	Queued     int    `json:"queued,omitempty"`
}

// nextOf returns what device's next message would get, or nil when the
// gateway does not say (Options.Next nil) or cannot read its windows.
func (s *Server) nextOf(device string, peek func(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error)) []NextJSON {
	if s.opts.Next == nil {
		return nil
	}
	list, err := s.opts.Next(device, peek)
	if err != nil {
		s.log.Error("next message not judged", "device", device, "err", err.Error())
		return nil
	}
	out := make([]NextJSON, len(list))
	for i, n := range list {
		out[i] = NextJSON{Class: n.Class, Outcome: n.Outcome, By: n.By, Queued: n.Queued}
		if n.RetryAfter > 0 {
			out[i].RetryAfter = ceilMillis(n.RetryAfter).String()
		}
	}
	return out
}
