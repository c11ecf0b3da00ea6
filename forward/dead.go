package forward

import (
	"bytes"
	"encoding/binary"
	"sync"
	"time"
)

// RefusedError is a destination's refusal of one message for good: the
// same message sent again would be refused again (an ACL, a size
// limit, a key of the wrong type). The forwarder moves the message to
// its dead-letter log and goes on; any other error of a message is
// transient, and the message is sent again, in order.
type RefusedError struct {
	// Reason names the refusal in metrics: a short snake_case word
	// ("not_authorized", "too_large", "wrong_type").
	Reason string
	Err    error
}

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// Refuse returns err as a refusal for good, named reason.
func Refuse(reason string, err error) error { return &RefusedError{Reason: reason, Err: err} }

// MaxDeadLetters bounds each forward log's dead-letter log: beyond it,
// the oldest dead letter makes room for the new one (counted as
// dropped).
const MaxDeadLetters = 10000

// DeadLetter is a message a destination refused for good.
type DeadLetter struct {
	Seq uint64 // its key in the dead-letter log: its number in the forward log it left
	// ID is the message's ID (Message.ID), the same in every listing
	// and every replay: a replayed message goes upstream under it, and
	// if refused again comes back under it, so a reader that saw it
	// can drop a repeat.
	ID      string
	At      time.Time // when it was refused
	Reason  string    // RefusedError.Reason
	Error   string    // what the destination said
	Message Message
	// Damaged says the entry or its record failed its checksum or could
	// not be read: Message is what could be read of it (nothing, at
	// worst; Error then says why); a replay leaves it, a drop deletes it.
	Damaged bool
}

// A dead letter's entry: version (1), the refusal time in Unix
// milliseconds (uvarint), the reason and the error (each a uvarint
// length and the bytes), then the message's forward record.
const deadV1 = 1

func appendDead(b []byte, at time.Time, reason, why string, rec []byte) []byte {
	b = append(b, deadV1)
	b = binary.AppendUvarint(b, uint64(max(at.UnixMilli(), 0)))
	b = appendString(b, reason)
	b = appendString(b, why)
	return append(b, rec...)
}

// decodeDead reads entry seq of a dead-letter log; an entry that cannot
// be read is returned Damaged, with why in Error. The message shares b's
// memory.
func decodeDead(seq uint64, b []byte) DeadLetter {
	if len(b) < 1 || b[0] != deadV1 {
		return DeadLetter{Seq: seq, Damaged: true, Error: "not a dead letter of version 1"}
	}
	r := recordReader{b: b[1:]}
	ms := r.uvarint("time")
	reason := string(r.bytes("reason"))
	why := string(r.bytes("error"))
	if r.err != nil {
		return DeadLetter{Seq: seq, Damaged: true, Error: "dead letter: " + r.err.Error()}
	}
	d := DeadLetter{Seq: seq, At: time.UnixMilli(int64(min(ms, maxMillis))), Reason: reason, Error: why}
	m, err := decodeRecord(r.b)
	d.Damaged = err != nil || checkRecord(seq, r.b) != nil
	if err == nil {
		d.Message = m
	}
	return d
}

// deadCounts counts the dead letters by reason since start.
type deadCounts struct {
	mu       sync.Mutex
	byReason map[string]uint64
	dropped  uint64 // dead letters dropped for room (MaxDeadLetters)
	held     int    // in the dead-letter log now
	logged   map[string]time.Time
	// log is held by whatever changes the dead-letter log (the
	// forwarder moving a message there, a replay, a drop), so that two
	// replays never send one dead letter twice, and by whatever reads
	// again.
	log sync.Mutex
	// again holds the keys of the dead letters whose ID is not their
	// log's prefix and key (a replayed message refused again keeps the
	// ID it first had, under a new number), by ID: with it, a dead
	// letter is found by its ID without reading the others (findDead).
	again map[string][]uint64
}

// deadLetter moves message seq to the dead-letter log, refused for
// good by ref.
func (f *Forwarder) deadLetter(seq uint64, ref *RefusedError) error {
	var rec []byte
	if err := f.log.ReadForward(f.cfg.Name, seq, func(s uint64, r []byte) bool {
		if s == seq {
			rec = append([]byte(nil), r...)
		}
		return false
	}); err != nil {
		return err
	}
	if rec == nil {
		return nil // gone already (trimmed)
	}
	return f.moveDead(seq, rec, ref)
}

// moveDead moves record rec, message seq, to the dead-letter log, set
// aside for ref (a refusal, or damage: reason "damaged").
func (f *Forwarder) moveDead(seq uint64, rec []byte, ref *RefusedError) error {
	f.dead.log.Lock()
	defer f.dead.log.Unlock()
	dropped, err := f.log.MoveForwardDead(f.cfg.Name, seq, appendDead(nil, f.cfg.Now(), ref.Reason, ref.Error(), rec), MaxDeadLetters)
	if err != nil {
		return err
	}
	f.indexDead(seq, rec)
	if dropped > 0 {
		f.pruneAgain()
	}
	d := &f.dead
	d.mu.Lock()
	if d.byReason == nil {
		d.byReason, d.logged = map[string]uint64{}, map[string]time.Time{}
	}
	d.byReason[ref.Reason]++
	d.dropped += uint64(dropped)
	d.held += 1 - dropped
	logIt := time.Since(d.logged[ref.Reason]) >= failureLogEvery
	if logIt {
		d.logged[ref.Reason] = time.Now()
	}
	n := d.byReason[ref.Reason]
	d.mu.Unlock()
	// After the dead-letter counts: whoever sees the backlog without it
	// (Stats reads the backlog first) sees it counted there.
	f.backlog.Add(-1)
	f.backlogBytes.Add(-int64(len(rec)))
	f.deadMoved.Add(1)
	if logIt && ref.Reason == "damaged" {
		f.slog.Error("forward log record damaged; set aside with the dead letters, not forwarded", "seq", seq, "error", ref.Err,
			"damaged_so_far", n, "list_with", "gateway forward dead list "+f.cfg.Upstream)
	} else if logIt {
		f.slog.Warn("message refused for good by the upstream; moved to the dead letters", "reason", ref.Reason, "error", ref.Err,
			"dead_letters_so_far", n, "list_with", "gateway forward dead list "+f.cfg.Upstream)
	}
	return nil
}

// DeadLetters returns up to limit of the dead letters (all when limit
// < 0), oldest first, and how many there are. An entry that cannot be
// read is listed Damaged; the others are listed all the same.
func (f *Forwarder) DeadLetters(limit int) ([]DeadLetter, int, error) {
	var out []DeadLetter
	n := 0
	err := f.log.ReadDead(f.cfg.Name, 0, func(seq uint64, entry []byte) bool {
		n++
		if limit < 0 || len(out) < limit {
			// entry is the file's memory, valid only during the read.
			out = append(out, f.deadLetter1(seq, bytes.Clone(entry)))
		}
		return true
	})
	return out, n, err
}

// deadLetter1 decodes entry seq, its ID set.
func (f *Forwarder) deadLetter1(seq uint64, entry []byte) DeadLetter {
	d := decodeDead(seq, entry)
	d.ID = d.Message.ID
	if d.ID == "" {
		d.ID = f.ownID(seq)
	}
	return d
}
