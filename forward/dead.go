package forward

import (
	"encoding/binary"
	"errors"
	"fmt"
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
	Seq     uint64    // its number in the forward log it left
	At      time.Time // when it was refused
	Reason  string    // RefusedError.Reason
	Error   string    // what the destination said
	Message Message
	// Damaged says the record failed its checksum or could not be read:
	// Message is what could be read of it (nothing, at worst); a replay
	// leaves it.
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

func decodeDead(seq uint64, b []byte) (DeadLetter, error) {
	if len(b) < 1 || b[0] != deadV1 {
		return DeadLetter{}, errors.New("not a dead letter of version 1")
	}
	r := recordReader{b: b[1:]}
	ms := r.uvarint("time")
	reason := string(r.bytes("reason"))
	why := string(r.bytes("error"))
	if r.err != nil {
		return DeadLetter{}, r.err
	}
	d := DeadLetter{Seq: seq, At: time.UnixMilli(int64(min(ms, maxMillis))), Reason: reason, Error: why}
	m, err := decodeRecord(r.b)
	d.Damaged = err != nil || checkRecord(seq, r.b) != nil
	if err == nil {
		d.Message = m
	}
	return d, nil
}

// deadCounts counts the dead letters by reason since start.
type deadCounts struct {
	mu       sync.Mutex
	byReason map[string]uint64
	dropped  uint64 // dead letters dropped for room (MaxDeadLetters)
	held     int    // in the dead-letter log now
	logged   map[string]time.Time
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
	dropped, err := f.log.MoveForwardDead(f.cfg.Name, seq, appendDead(nil, f.cfg.Now(), ref.Reason, ref.Error(), rec), MaxDeadLetters)
	if err != nil {
		return err
	}
	f.backlog.Add(-1)
	f.backlogBytes.Add(-int64(len(rec)))
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
// < 0), oldest first, and how many there are.
func (f *Forwarder) DeadLetters(limit int) ([]DeadLetter, int, error) {
	var out []DeadLetter
	n := 0
	var bad error
	err := f.log.ReadDead(f.cfg.Name, func(seq uint64, entry []byte) bool {
		n++
		if limit < 0 || len(out) < limit {
			d, err := decodeDead(seq, entry)
			if err != nil && bad == nil {
				bad = fmt.Errorf("dead letter %d of %s: %w", seq, f.cfg.Name, err)
			}
			if err == nil {
				out = append(out, d)
			}
		}
		return true
	})
	if err == nil {
		err = bad
	}
	return out, n, err
}

// ReplayDead appends every dead letter to the forward log again (after
// what it holds, in their order) and removes them from the dead-letter
// log; it returns how many. A crash between the two may leave a
// replayed message in both.
func (f *Forwarder) ReplayDead() (int, error) {
	dead, _, err := f.DeadLetters(-1)
	if err != nil {
		return 0, err
	}
	var waits []func() error
	var seqs []uint64
	for i := range dead {
		if dead[i].Damaged {
			continue // nothing sound to send: drop deletes it
		}
		m := dead[i].Message
		m.ID = ""
		w, err := f.AppendAsync(&m)
		if err != nil {
			return 0, err
		}
		waits = append(waits, w)
		seqs = append(seqs, dead[i].Seq)
	}
	for _, w := range waits {
		if err := w(); err != nil {
			return 0, err
		}
	}
	return len(seqs), f.forgetDead(seqs)
}

// DropDead deletes every dead letter and returns how many.
func (f *Forwarder) DropDead() (int, error) {
	var seqs []uint64
	if err := f.log.ReadDead(f.cfg.Name, func(seq uint64, _ []byte) bool { seqs = append(seqs, seq); return true }); err != nil {
		return 0, err
	}
	return len(seqs), f.forgetDead(seqs)
}

func (f *Forwarder) forgetDead(seqs []uint64) error {
	if err := f.log.DeleteDead(f.cfg.Name, seqs); err != nil {
		return err
	}
	n, err := f.log.DeadCount(f.cfg.Name)
	f.dead.mu.Lock()
	f.dead.held = n
	f.dead.mu.Unlock()
	return err
}
