package admin

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/devicegate/devicegate/devicelimit"
)

// DeferredMessage is one message of a device's deferral queue.
type DeferredMessage struct {
	Topic    string
	Class    string // "" for the device's own quota
	Size     int    // payload bytes
	QoS      byte
	Enqueued devicelimit.Tick
}

// DeferredMessageJSON is a deferred message in the API: its topic, its
// topic class ("" omitted: the device's own quota), payload bytes, QoS,
// when it was deferred and how long ago.
type DeferredMessageJSON struct {
	Topic      string  `json:"topic"`
	Class      string  `json:"class,omitempty"`
	Size       int     `json:"size"`
	QoS        byte    `json:"qos"`
	DeferredAt string  `json:"deferred_at"`
	AgeSeconds float64 `json:"age_seconds"`
}

// DeferredListJSON answers GET /api/v1/devices/{id}/deferred: the first
// messages of the device's queue (at most limit) and how many it holds.
type DeferredListJSON struct {
	Device   string                `json:"device"`
	Total    int                   `json:"total"`
	Messages []DeferredMessageJSON `json:"messages"`
}

// defaultDeferredList and maxDeferredList bound the messages one list
// returns.
const defaultDeferredList, maxDeferredList = 20, 1000

// limitParam reads the query's limit, def when absent; it answers 400
// for one not between 1 and max, or given twice.
func limitParam(w http.ResponseWriter, r *http.Request, def, max int) (int, bool) {
	vs, ok := r.URL.Query()["limit"]
	if !ok {
		return def, true
	}
	v, err := strconv.Atoi(vs[0])
	if len(vs) != 1 || err != nil || v < 1 || v > max {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be an integer between 1 and %d, given once (got %q)", max, vs))
		return 0, false
	}
	return v, true
}

// listDeferred lists a device's deferred messages, oldest first.
func (s *Server) listDeferred(w http.ResponseWriter, r *http.Request) {
	id, ok := deviceID(w, r)
	if !ok {
		return
	}
	n, ok := limitParam(w, r, defaultDeferredList, maxDeferredList)
	if !ok {
		return
	}
	out := DeferredListJSON{Device: id, Messages: []DeferredMessageJSON{}}
	if s.opts.Deferred != nil {
		var list []DeferredMessage
		list, out.Total = s.opts.Deferred(id, n)
		now := s.opts.Clock.Now()
		for _, m := range list {
			out.Messages = append(out.Messages, DeferredMessageJSON{Topic: m.Topic, Class: m.Class, Size: m.Size, QoS: m.QoS,
				DeferredAt: formatTick(m.Enqueued), AgeSeconds: max(0, now.Sub(m.Enqueued).Seconds())})
		}
	}
	writeJSON(w, http.StatusOK, out)
}
