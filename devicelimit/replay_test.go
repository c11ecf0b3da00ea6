package devicelimit

import (
	"bytes"
	"crypto/sha256"
	"flag"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"testing"
)

// The property tests draw each sequence from its own source,
// rand.NewPCG(seed, seq): a failure prints the seed and the sequence,
// and -seed and -seq run that sequence alone, as it ran.
var (
	seedFlag = flag.Uint64("seed", 0, "the seed of the property tests' sequences (0: each test's own)")
	seqFlag  = flag.Int("seq", -1, "run only this sequence of the property tests (-1: all)")
)

// forEachSeq runs n sequences of the property test t, sequence seq
// drawn from rand.NewPCG(seed, seq) (seed: -seed, or the test's own),
// or only sequence -seq. When t fails, it logs the line that replays
// the failing sequence.
func forEachSeq(t *testing.T, seed uint64, n int, run func(seq int, r *rand.Rand)) {
	t.Helper()
	if *seedFlag != 0 {
		seed = *seedFlag
	}
	first, last := 0, n
	if *seqFlag >= 0 {
		first, last = *seqFlag, *seqFlag+1
	}
	seq := first
	defer func() {
		if t.Failed() {
			t.Logf("replay: go test ./devicelimit -run '^%s$' -seed %d -seq %d", t.Name(), seed, seq)
		}
	}()
	for ; seq < last && !t.Failed(); seq++ {
		run(seq, rand.New(rand.NewPCG(seed, uint64(seq))))
	}
	if t.Failed() {
		seq-- // the loop went past the failing one
	}
}

// TestLeaseSequencesReplay: the seed of a lease property test replays
// its run byte for byte. The events of the same sequences (each
// decision, lease written, window collected, crash charge) are the same
// when run again on tables whose hash seed differs, as another
// process's does (hashSeed is random per process), and a sequence run
// alone (-seq) has the events it had in the whole run.
func TestLeaseSequencesReplay(t *testing.T) {
	seqs := 200 / raceScale
	runs := []struct {
		name string
		run  func(seq int, r *rand.Rand, trace *bytes.Buffer, tabs map[int]*Table)
	}{
		{"TestPropertyLeasesKeepQuotaAcrossCrashes", func(seq int, r *rand.Rand, trace *bytes.Buffer, tabs map[int]*Table) {
			checkActed(t, seq, leaseSequence(t, r, tabs, trace).acted)
		}},
		{"TestPropertyCrashCostsAtMostALease", func(seq int, r *rand.Rand, trace *bytes.Buffer, _ map[int]*Table) {
			crashCostSequence(t, seq, r, trace)
		}},
	}
	defer func(s maphash.Seed) { hashSeed = s }(hashSeed)
	for _, tc := range runs {
		name, run := tc.name, tc.run
		// events runs the sequences [first, last) of seed 1 on tables
		// hashed with a new seed and returns their events.
		events := func(first, last int) []byte {
			hashSeed = maphash.MakeSeed()
			var trace bytes.Buffer
			tabs := map[int]*Table{}
			for seq := first; seq < last; seq++ {
				fmt.Fprintf(&trace, "sequence %d\n", seq)
				run(seq, rand.New(rand.NewPCG(1, uint64(seq))), &trace, tabs)
			}
			return trace.Bytes()
		}
		a, b := events(0, seqs), events(0, seqs)
		t.Logf("%s: %d sequences, %d bytes of events, digests %x and %x", name, seqs, len(a), sha256.Sum256(a), sha256.Sum256(b))
		if !bytes.Equal(a, b) {
			t.Errorf("%s: the same seed, another hash seed: the events differ %s", name, firstDiff(a, b))
		}
		// The last sequence alone, on a new table.
		alone := events(seqs-1, seqs)
		if i := bytes.Index(a, []byte(fmt.Sprintf("sequence %d\n", seqs-1))); !bytes.Equal(a[i:], alone) {
			t.Errorf("%s: sequence %d alone: its events differ from the run's %s", name, seqs-1, firstDiff(a[i:], alone))
		}
	}
}

// firstDiff says where the lines of a and b first differ.
func firstDiff(a, b []byte) string {
	la, lb := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := range min(len(la), len(lb)) {
		if !bytes.Equal(la[i], lb[i]) {
			return fmt.Sprintf("at line %d:\n%s\n%s", i+1, la[i], lb[i])
		}
	}
	return fmt.Sprintf("in length: %d and %d lines", len(la), len(lb))
}
