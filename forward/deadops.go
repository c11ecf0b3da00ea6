package forward

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// NoDeadError is the answer of a replay or a drop given IDs of which
// some are no dead letter of the logs: nothing was done.
type NoDeadError struct{ IDs []string }

func (e *NoDeadError) Error() string {
	return fmt.Sprintf("no dead letter with the id %q", strings.Join(e.IDs, `", "`))
}

// ReplayDead appends the dead letters whose ID is in ids (every one
// when none is given) to the forward log again (after what it holds, in
// their order), each under the ID it had, and removes them from the
// dead-letter log in the same transaction; it returns how many. A
// damaged one stays. An ID the log does not hold gives a *NoDeadError,
// and nothing is replayed. Replays, drops and the forwarder's own moves
// exclude each other, the check of the IDs included, so of two replays
// of one ID at once one sends it and the other answers *NoDeadError.
// A replay of every dead letter replays those the log held when it
// started (one read), deadChunk at a time, each chunk under the lock
// alone: the forwarder's move of a refused message waits for one chunk,
// not the whole replay, and a dead letter that arrives meanwhile (a
// replayed one refused again among them) waits for the next replay;
// one dropped or replayed by someone else between chunks is skipped.
// When an append is refused (a full log under refuse_new, the disk),
// those already appended leave the dead-letter log, the rest stay, and
// it returns how many went with the error. A crash leaves each message
// in one of the two logs, never both.
func (f *Forwarder) ReplayDead(ids ...string) (int, error) {
	return ReplayDeadOf([]*Forwarder{f}, ids)
}

// DropDead deletes the dead letters whose ID is in ids (every one when
// none is given), damaged ones too, and returns how many. An ID the log
// does not hold gives a *NoDeadError, and nothing is deleted. A drop of
// every dead letter goes in chunks as ReplayDead's.
func (f *Forwarder) DropDead(ids ...string) (int, error) {
	return DropDeadOf([]*Forwarder{f}, ids)
}

// ReplayDeadOf is ReplayDead over the logs of fs (an upstream's
// connections) at once: an ID none of them holds gives a *NoDeadError
// and nothing is replayed in any. With no ids, it replays what every
// log held when it started, log by log, in chunks.
func ReplayDeadOf(fs []*Forwarder, ids []string) (int, error) {
	return deadOp(fs, ids, (*Forwarder).replay)
}

// DropDeadOf is DropDead over the logs of fs at once: an ID none of
// them holds gives a *NoDeadError and nothing is deleted in any.
func DropDeadOf(fs []*Forwarder, ids []string) (int, error) {
	return deadOp(fs, ids, (*Forwarder).drop)
}

// deadChunk is how many dead letters a replay or a drop of them all
// takes at a time under its log's lock: what the forwarder's own move of
// a refused message waits for at most (TestReplayDoesNotStallForwarder).
// It is also the most IDs the admin API takes in one call
// (admin/dead.go), so a call by IDs holds the locks as long as a chunk.
const deadChunk = 1000

// deadOp finds the dead letters of ids in the logs of fs and hands each
// log's to act, holding every log's dead letters from the search to the
// end of act: nobody changes them between the check and the act. With
// no ids, it acts on all of them in chunks (deadOpAll).
func deadOp(fs []*Forwarder, ids []string, act func(*Forwarder, []DeadLetter) (int, error)) (int, error) {
	// One lock order for every caller: by name, each forwarder once.
	fs = slices.Clone(fs)
	slices.SortFunc(fs, func(a, b *Forwarder) int { return cmp.Compare(a.cfg.Name, b.cfg.Name) })
	fs = slices.Compact(fs)
	if len(ids) == 0 {
		return deadOpAll(fs, act)
	}
	for _, f := range fs {
		f.dead.log.Lock()
		defer f.dead.log.Unlock()
	}
	sel := make([][]DeadLetter, len(fs))
	found := map[string]bool{}
	for i, f := range fs {
		var err error
		if sel[i], err = f.findDead(ids); err != nil {
			return 0, err
		}
		for _, d := range sel[i] {
			found[d.ID] = true
		}
	}
	var missing []string
	for _, id := range ids {
		if !found[id] && !slices.Contains(missing, id) {
			missing = append(missing, id)
		}
	}
	if missing != nil {
		return 0, &NoDeadError{IDs: missing}
	}
	total := 0
	for i, f := range fs {
		if len(sel[i]) == 0 {
			continue
		}
		n, err := act(f, sel[i])
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// deadOpAll hands act the dead letters the logs of fs hold now (read
// first, without a lock), deadChunk at a time, each chunk read again
// and acted on under its log's lock alone: between chunks the forwarder
// moves what is refused, and others replay or drop. A dead letter gone
// meanwhile is skipped (whoever took it acted on it); one that arrived
// meanwhile is not one of these. Chunks are taken in key order, so the
// replayed messages keep their log's order.
func deadOpAll(fs []*Forwarder, act func(*Forwarder, []DeadLetter) (int, error)) (int, error) {
	keys := make([][]uint64, len(fs))
	for i, f := range fs {
		if err := f.log.ReadDead(f.cfg.Name, 0, func(seq uint64, _ []byte) bool {
			keys[i] = append(keys[i], seq)
			return true
		}); err != nil {
			return 0, err
		}
	}
	total := 0
	for i, f := range fs {
		for ks := keys[i]; len(ks) > 0; {
			chunk := ks[:min(len(ks), deadChunk)]
			ks = ks[len(chunk):]
			n, err := f.actOnDead(chunk, act)
			total += n
			if err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// actOnDead hands act those of dead letters keys (in order) the log
// still holds, under f.dead.log.
func (f *Forwarder) actOnDead(keys []uint64, act func(*Forwarder, []DeadLetter) (int, error)) (int, error) {
	f.dead.log.Lock()
	defer f.dead.log.Unlock()
	var sel []DeadLetter
	last := keys[len(keys)-1]
	if err := f.log.ReadDead(f.cfg.Name, keys[0], func(seq uint64, entry []byte) bool {
		if _, ok := slices.BinarySearch(keys, seq); ok {
			// entry is the file's memory, valid only during the read.
			sel = append(sel, f.deadLetter1(seq, bytes.Clone(entry)))
		}
		return seq < last
	}); err != nil || len(sel) == 0 {
		return 0, err
	}
	return act(f, sel)
}

// findDead returns the dead letters whose ID is in ids, in key order,
// each once. A dead letter is looked for under the number its ID names
// and under the keys again holds for it, not by reading the others. The
// caller holds f.dead.log.
func (f *Forwarder) findDead(ids []string) ([]DeadLetter, error) {
	var out []DeadLetter
	for _, id := range ids {
		keys := f.dead.again[id]
		if n, ok := f.numberOf(id); ok {
			keys = append(keys[:len(keys):len(keys)], n)
		}
		for _, k := range keys {
			d, ok, err := f.deadAt(k)
			if err != nil {
				return nil, err
			}
			if ok && d.ID == id && !slices.ContainsFunc(out, func(o DeadLetter) bool { return o.Seq == k }) {
				out = append(out, d)
			}
		}
	}
	slices.SortFunc(out, func(a, b DeadLetter) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// numberOf returns the number an ID of this log names (its prefix and
// the number), if it names one.
func (f *Forwarder) numberOf(id string) (uint64, bool) {
	rest, ok := strings.CutPrefix(id, f.idPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 64)
	return n, err == nil
}

// deadAt returns dead letter seq, and whether the log holds it.
func (f *Forwarder) deadAt(seq uint64) (d DeadLetter, ok bool, err error) {
	err = f.log.ReadDead(f.cfg.Name, seq, func(s uint64, entry []byte) bool {
		if s == seq {
			d, ok = f.deadLetter1(seq, bytes.Clone(entry)), true
		}
		return false
	})
	return d, ok, err
}

// replay is ReplayDead's act on dead, found in f's log: each message
// leaves the dead letters in the transaction that appends it again.
func (f *Forwarder) replay(dead []DeadLetter) (int, error) {
	var waits []Queued
	var appended []DeadLetter
	var appendErr error
	for i := range dead {
		if dead[i].Damaged {
			continue // nothing sound to send: drop deletes it
		}
		m := dead[i].Message
		m.ID = dead[i].ID
		w, err := f.appendAsync(&m, dead[i].Seq)
		if err != nil {
			appendErr = err // a full log, the disk: the rest stay dead letters
			break
		}
		waits = append(waits, w)
		appended = append(appended, dead[i])
	}
	var sent []DeadLetter
	var waitErr error
	for i, w := range waits {
		if err := w.Wait(); err != nil {
			waitErr = errors.Join(waitErr, err)
			continue
		}
		sent = append(sent, appended[i])
	}
	return len(sent), errors.Join(appendErr, waitErr, f.forgotDead(sent))
}

// drop is DropDead's act on dead, found in f's log.
func (f *Forwarder) drop(dead []DeadLetter) (int, error) {
	return len(dead), f.forgetDead(dead)
}

// forgetDead deletes dead from the dead-letter log, all or none (in one
// transaction that checks they are there). The caller holds
// f.dead.log.
func (f *Forwarder) forgetDead(dead []DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	seqs := make([]uint64, len(dead))
	for i, d := range dead {
		seqs[i] = d.Seq
	}
	if err := f.log.DeleteDead(f.cfg.Name, seqs); err != nil {
		return err
	}
	return f.forgotDead(dead)
}

// forgotDead counts dead out of the dead-letter log (deleted, or
// replayed). The caller holds f.dead.log.
func (f *Forwarder) forgotDead(dead []DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	for _, d := range dead {
		f.unindexDead(d.ID, d.Seq)
	}
	n, err := f.log.DeadCount(f.cfg.Name)
	f.dead.mu.Lock()
	f.dead.held = n
	f.dead.mu.Unlock()
	return err
}

// loadAgain fills f.dead.again from the dead-letter log (New).
func (f *Forwarder) loadAgain() error {
	return f.log.ReadDead(f.cfg.Name, 0, func(seq uint64, entry []byte) bool {
		if d := f.deadLetter1(seq, entry); d.ID != f.ownID(seq) {
			f.addAgain(d.ID, seq)
		}
		return true
	})
}

// indexDead notes, in again, dead letter seq of record rec when its ID
// is not its own. The caller holds f.dead.log.
func (f *Forwarder) indexDead(seq uint64, rec []byte) {
	if m, err := decodeRecord(rec); err == nil && m.ID != "" && m.ID != f.ownID(seq) {
		f.addAgain(m.ID, seq)
	}
}

func (f *Forwarder) addAgain(id string, seq uint64) {
	if f.dead.again == nil {
		f.dead.again = map[string][]uint64{}
	}
	f.dead.again[id] = append(f.dead.again[id], seq)
}

// unindexDead forgets dead letter seq, of ID id, in again.
func (f *Forwarder) unindexDead(id string, seq uint64) {
	keys := slices.DeleteFunc(f.dead.again[id], func(k uint64) bool { return k == seq })
	if len(keys) == 0 {
		delete(f.dead.again, id)
	} else {
		f.dead.again[id] = keys
	}
}

// pruneAgain forgets, in again, the dead letters dropped for room: the
// oldest, below the first key held. Should the read fail, what stays is
// harmless: findDead reads what again points to before it trusts it.
// The caller holds f.dead.log.
func (f *Forwarder) pruneAgain() {
	if len(f.dead.again) == 0 {
		return
	}
	first, held := uint64(0), false
	if f.log.ReadDead(f.cfg.Name, 0, func(seq uint64, _ []byte) bool { first, held = seq, true; return false }) != nil {
		return
	}
	for id, keys := range f.dead.again {
		if keys = slices.DeleteFunc(keys, func(k uint64) bool { return !held || k < first }); len(keys) == 0 {
			delete(f.dead.again, id)
		} else {
			f.dead.again[id] = keys
		}
	}
}

// ownID is the ID of message seq of f's log as first written.
func (f *Forwarder) ownID(seq uint64) string { return f.idPrefix + strconv.FormatUint(seq, 10) }
