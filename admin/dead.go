package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// DeadLetters lists, replays and drops the messages an upstream
// refused for good (its dead-letter logs). A name that is no upstream
// gives ErrNoUpstream. ids, when not empty, selects the dead letters by
// their ID; an ID held by none gives a *NoDeadError and changes
// nothing.
type DeadLetters interface {
	DeadLetters(upstream string, limit int) (total int, list []DeadLetter, err error)
	ReplayDead(upstream string, ids []string) (int, error)
	DropDead(upstream string, ids []string) (int, error)
}

// ErrNoUpstream is DeadLetters' error for a name that is no upstream.
var ErrNoUpstream = errors.New("no such upstream")

// NoDeadError is DeadLetters' error for IDs that are no dead letter of
// the upstream.
type NoDeadError struct{ IDs []string }

func (e *NoDeadError) Error() string {
	return fmt.Sprintf("no dead letter with the id %q", strings.Join(e.IDs, `", "`))
}

// DeadLetter is one message an upstream refused for good.
type DeadLetter struct {
	Log     string // the forward log it left ("NAME/0")
	Seq     uint64 // its key in that log's dead letters
	ID      string // the message's ID, the same across replays
	At      time.Time
	Reason  string
	Error   string
	Device  string
	Topic   string
	Payload int  // bytes
	Damaged bool // the entry could not be read whole: a replay leaves it
}

// DeadLetterJSON is one dead letter in GET /api/v1/forward/{name}/dead.
type DeadLetterJSON struct {
	Log          string `json:"log"`
	Seq          uint64 `json:"seq"`
	ID           string `json:"id"`
	RefusedAt    string `json:"refused_at,omitempty"` // absent when unreadable (Damaged)
	Reason       string `json:"reason"`
	Error        string `json:"error"`
	Device       string `json:"device"`
	Topic        string `json:"topic"`
	PayloadBytes int    `json:"payload_bytes"`
	Damaged      bool   `json:"damaged"`
}

// DeadListJSON answers GET /api/v1/forward/{name}/dead.
type DeadListJSON struct {
	Upstream    string           `json:"upstream"`
	Total       int              `json:"total"`
	DeadLetters []DeadLetterJSON `json:"dead_letters"`
}

// DeadDoneJSON answers the replay (Replayed) and the deletion (Dropped)
// of dead letters: the one of the two done, 0 included.
type DeadDoneJSON struct {
	Upstream string `json:"upstream"`
	Replayed *int   `json:"replayed,omitempty"`
	Dropped  *int   `json:"dropped,omitempty"`
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
		at := ""
		if !d.At.IsZero() {
			at = d.At.UTC().Format(time.RFC3339Nano)
		}
		out.DeadLetters = append(out.DeadLetters, DeadLetterJSON{Log: d.Log, Seq: d.Seq, ID: d.ID, RefusedAt: at,
			Reason: d.Reason, Error: d.Error, Device: d.Device, Topic: d.Topic, PayloadBytes: d.Payload, Damaged: d.Damaged})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) replayDead(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ids, ok := deadIDs(w, r)
	if !ok {
		return
	}
	n, err := s.deadLetters().ReplayDead(name, ids)
	if s.deadOK(w, name, "replay dead letters", err) {
		s.log.Info("dead letters replayed", "upstream", name, "messages", n, "ids", len(ids))
		writeJSON(w, http.StatusOK, DeadDoneJSON{Upstream: name, Replayed: &n})
	}
}

func (s *Server) dropDead(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ids, ok := deadIDs(w, r)
	if !ok {
		return
	}
	n, err := s.deadLetters().DropDead(name, ids)
	if s.deadOK(w, name, "drop dead letters", err) {
		s.log.Warn("dead letters dropped", "upstream", name, "messages", n, "ids", len(ids))
		writeJSON(w, http.StatusOK, DeadDoneJSON{Upstream: name, Dropped: &n})
	}
}

// maxDeadIDs bounds the id parameters of one replay or drop.
const maxDeadIDs = 1000

// deadIDs returns the request's id query parameters (none: every dead
// letter), answering 400 for an empty one or too many.
func deadIDs(w http.ResponseWriter, r *http.Request) ([]string, bool) {
	ids := r.URL.Query()["id"]
	if len(ids) > maxDeadIDs {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("at most %d id parameters (got %d)", maxDeadIDs, len(ids)))
		return nil, false
	}
	for _, id := range ids {
		if id == "" {
			writeError(w, http.StatusBadRequest, "an empty id parameter: give a dead letter's id, or none for every dead letter")
			return nil, false
		}
	}
	return ids, true
}

// deadOK answers err, when not nil: 404 for an unknown upstream or dead
// letter, 500 otherwise (logged).
func (s *Server) deadOK(w http.ResponseWriter, name, what string, err error) bool {
	var none *NoDeadError
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrNoUpstream):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no upstream named %q in forward:", name))
	case errors.As(err, &none):
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s of upstream %q; nothing done", none.Error(), name))
	default:
		s.log.Error(what, "upstream", name, "err", err)
		writeError(w, http.StatusInternalServerError, what+" failed; see the gateway's log")
	}
	return false
}

// noDead is DeadLetters without forwarding: every name is unknown.
type noDead struct{}

func (noDead) DeadLetters(string, int) (int, []DeadLetter, error) { return 0, nil, ErrNoUpstream }
func (noDead) ReplayDead(string, []string) (int, error)           { return 0, ErrNoUpstream }
func (noDead) DropDead(string, []string) (int, error)             { return 0, ErrNoUpstream }

func (s *Server) deadLetters() DeadLetters {
	if s.opts.Dead == nil {
		return noDead{}
	}
	return s.opts.Dead
}
