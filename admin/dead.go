package admin

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// DeadLetters lists, replays and drops the messages an upstream
// refused for good (its dead-letter logs). A name that is no upstream
// gives ErrNoUpstream.
type DeadLetters interface {
	DeadLetters(upstream string, limit int) (total int, list []DeadLetter, err error)
	ReplayDead(upstream string) (int, error)
	DropDead(upstream string) (int, error)
}

// ErrNoUpstream is DeadLetters' error for a name that is no upstream.
var ErrNoUpstream = errors.New("no such upstream")

// DeadLetter is one message an upstream refused for good.
type DeadLetter struct {
	Log     string    // the forward log it left ("NAME/0")
	Seq     uint64    // its number there
	At      time.Time // when it was refused
	Reason  string
	Error   string
	Device  string
	Topic   string
	Payload int // bytes
}

// DeadLetterJSON is one dead letter in GET /api/v1/forward/{name}/dead.
type DeadLetterJSON struct {
	Log          string `json:"log"`
	Seq          uint64 `json:"seq"`
	RefusedAt    string `json:"refused_at"`
	Reason       string `json:"reason"`
	Error        string `json:"error"`
	Device       string `json:"device"`
	Topic        string `json:"topic"`
	PayloadBytes int    `json:"payload_bytes"`
}

// DeadListJSON answers GET /api/v1/forward/{name}/dead.
type DeadListJSON struct {
	Upstream    string           `json:"upstream"`
	Total       int              `json:"total"`
	DeadLetters []DeadLetterJSON `json:"dead_letters"`
}

// DeadDoneJSON answers the replay and the deletion of dead letters.
type DeadDoneJSON struct {
	Upstream string `json:"upstream"`
	Replayed int    `json:"replayed,omitempty"`
	Dropped  int    `json:"dropped,omitempty"`
}

// defaultDead and maxDead bound the dead letters one list returns.
const defaultDead, maxDead = 100, 10000

func (s *Server) listDead(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n, ok := limitParam(w, r, defaultDead, maxDead)
	if !ok {
		return
	}
	total, list, err := s.deadLetters().DeadLetters(name, n)
	if !s.deadOK(w, name, "list dead letters", err) {
		return
	}
	out := DeadListJSON{Upstream: name, Total: total, DeadLetters: make([]DeadLetterJSON, 0, len(list))}
	for _, d := range list {
		out.DeadLetters = append(out.DeadLetters, DeadLetterJSON{Log: d.Log, Seq: d.Seq, RefusedAt: d.At.UTC().Format(time.RFC3339Nano),
			Reason: d.Reason, Error: d.Error, Device: d.Device, Topic: d.Topic, PayloadBytes: d.Payload})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) replayDead(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n, err := s.deadLetters().ReplayDead(name)
	if s.deadOK(w, name, "replay dead letters", err) {
		s.log.Info("dead letters replayed", "upstream", name, "messages", n)
		writeJSON(w, http.StatusOK, DeadDoneJSON{Upstream: name, Replayed: n})
	}
}

func (s *Server) dropDead(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n, err := s.deadLetters().DropDead(name)
	if s.deadOK(w, name, "drop dead letters", err) {
		s.log.Warn("dead letters dropped", "upstream", name, "messages", n)
		writeJSON(w, http.StatusOK, DeadDoneJSON{Upstream: name, Dropped: n})
	}
}

// deadOK answers err, when not nil: 404 for an unknown upstream, 500
// otherwise (logged).
func (s *Server) deadOK(w http.ResponseWriter, name, what string, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrNoUpstream):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no upstream named %q in forward:", name))
	default:
		s.log.Error(what, "upstream", name, "err", err)
		writeError(w, http.StatusInternalServerError, what+" failed; see the gateway's log")
	}
	return false
}

// noDead is DeadLetters without forwarding: every name is unknown.
type noDead struct{}

func (noDead) DeadLetters(string, int) (int, []DeadLetter, error) { return 0, nil, ErrNoUpstream }
func (noDead) ReplayDead(string) (int, error)                     { return 0, ErrNoUpstream }
func (noDead) DropDead(string) (int, error)                       { return 0, ErrNoUpstream }

func (s *Server) deadLetters() DeadLetters {
	if s.opts.Dead == nil {
		return noDead{}
	}
	return s.opts.Dead
}
