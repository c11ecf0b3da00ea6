package persist

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// CheckMode says when Open runs bbolt's consistency check of the whole
// file (Store.Check).
type CheckMode int

const (
	// CheckAlways checks at every Open (the zero value).
	CheckAlways CheckMode = iota
	// CheckAfterCrash checks only when the previous run did not shut
	// down cleanly.
	CheckAfterCrash
	// CheckNever skips the walk over every page: Open checks only the
	// freelist (Store.checkFreelist), so that no write allocates a
	// page outside the file; other damage is found only when a
	// transaction touches it, and a write may spread it first.
	CheckNever
)

// ParseCheckMode parses "always", "after_crash" or "never".
func ParseCheckMode(s string) (CheckMode, error) {
	switch s {
	case "always":
		return CheckAlways, nil
	case "after_crash":
		return CheckAfterCrash, nil
	case "never":
		return CheckNever, nil
	}
	return 0, fmt.Errorf("unknown check mode %q: want always, after_crash or never", s)
}

// String returns the mode as ParseCheckMode reads it.
func (m CheckMode) String() string {
	switch m {
	case CheckAlways:
		return "always"
	case CheckAfterCrash:
		return "after_crash"
	case CheckNever:
		return "never"
	}
	return fmt.Sprintf("CheckMode(%d)", int(m))
}

// maxCheckErrors is how many of bbolt's findings an error quotes.
const maxCheckErrors = 3

// Check runs bbolt's consistency check over the whole file: every page
// reachable from the buckets is a branch or leaf page referenced once and
// not free, every page below the high-water mark is reachable or free,
// no page is freed twice, and keys are in order. Damage that would only
// show when a later write allocates a page (a freelist page overwritten)
// is found here, before anything is served. A finding wraps ErrCorrupt
// and quotes the first few of bbolt's messages.
func (s *Store) Check() error {
	var found []string
	n := 0
	err := guard(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			// bbolt's check runs on a goroutine of its own, where a page
			// that is not what it claims to be panics beyond any recover.
			// Touch every page it will read here first, under guard.
			if err := s.precheck(tx); err != nil {
				return err
			}
			for err := range tx.Check() {
				if n < maxCheckErrors {
					found = append(found, err.Error())
				}
				n++
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("check store %q: %w", s.path, err)
	}
	if n == 0 {
		return nil
	}
	more := ""
	if n > len(found) {
		more = fmt.Sprintf(" (and %d more)", n-len(found))
	}
	return fmt.Errorf("check store %q: %w: consistency check failed: %s%s", s.path, ErrCorrupt, strings.Join(found, "; "), more)
}

// bbolt's page layout (go.etcd.io/bbolt/internal/common): a page starts
// with its own ID (8 bytes) and its flags (2 bytes); a meta page's body
// follows the 16-byte header with the freelist's page ID at 32 and the
// transaction ID at 48.
const (
	pageHeaderSize   = 16
	metaFreelistOff  = pageHeaderSize + 32
	metaHighOff      = pageHeaderSize + 40 // the high-water mark: pages in use end below it
	metaTxidOff      = pageHeaderSize + 48
	metaChecksumOff  = pageHeaderSize + 56
	metaPageFlag     = 0x04
	freelistPageFlag = 0x10
	noFreelist       = ^uint64(0)
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
)

// checkMetaPage reports what is wrong with meta page number page, read
// as b (its first metaChecksumOff+8 bytes), as bbolt would find it: its
// header, magic number, version and checksum (FNV-1a of the meta body
// before it). bbolt opens a file with one good meta page, but its
// consistency check reads both and stops the process on a damaged one.
func checkMetaPage(page uint64, b []byte) error {
	id, flags := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint16(b[8:])
	body := b[pageHeaderSize:]
	h := fnv.New64a()
	h.Write(b[pageHeaderSize:metaChecksumOff])
	switch {
	case id != page || flags != metaPageFlag:
		return fmt.Errorf("%w: meta page %d is damaged: it identifies itself as page %d with flags %#x", ErrCorrupt, page, id, flags)
	case binary.LittleEndian.Uint32(body) != boltMagic:
		return fmt.Errorf("%w: meta page %d is damaged: bad magic number %#x", ErrCorrupt, page, binary.LittleEndian.Uint32(body))
	case binary.LittleEndian.Uint32(body[4:]) != boltVersion:
		return fmt.Errorf("%w: meta page %d is damaged: version %d", ErrCorrupt, page, binary.LittleEndian.Uint32(body[4:]))
	case binary.LittleEndian.Uint64(b[metaChecksumOff:]) != h.Sum64():
		return fmt.Errorf("%w: meta page %d is damaged: checksum mismatch", ErrCorrupt, page)
	}
	return nil
}

// precheck reads every key of every bucket, so that each branch and leaf
// page bbolt's check will visit has been read (and vetted by bbolt) on
// this goroutine, and checks that the freelist page of tx's meta page
// identifies itself as that freelist.
func (s *Store) precheck(tx *bolt.Tx) error {
	var walk func(b *bolt.Bucket) error
	walk = func(b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				if child := b.Bucket(k); child != nil {
					return walk(child)
				}
			}
			return nil
		})
	}
	if err := tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b) }); err != nil {
		return err
	}
	return s.checkFreelist(tx, true)
}

// checkFreelist checks the freelist of tx's meta page, what a write
// allocates pages from: its page identifies itself as a freelist, and
// each page it lists is one of the file's (from 2 to the meta page's
// high-water mark), in ascending order, once. A damaged entry would
// make the next write allocate a page far beyond the file (bbolt then
// fails with "writeat ...: negative offset", after writing the pages
// before it) or over a page in use. With metas set, both meta pages
// are checked first (checkMetaPage). It reads the meta pages and the
// freelist only: what it cannot find (a listed page that is in use, a
// damaged branch or leaf page) is Check's.
func (s *Store) checkFreelist(tx *bolt.Tx, metas bool) error {
	f, err := os.Open(s.path)
	if err != nil {
		return err
	}
	defer f.Close()
	pageSize := int64(s.db.Info().PageSize)
	read := func(page uint64, off int64, n int) ([]byte, error) {
		b := make([]byte, n)
		if _, err := f.ReadAt(b, int64(page)*pageSize+off); err != nil {
			return nil, fmt.Errorf("%w: read page %d: %v", ErrCorrupt, page, err)
		}
		return b, nil
	}
	freelist, high := noFreelist, uint64(0)
	for meta := range uint64(2) {
		b, err := read(meta, 0, metaChecksumOff+8)
		if err != nil {
			return err
		}
		bad := checkMetaPage(meta, b)
		if metas && bad != nil {
			return bad
		}
		if bad == nil && binary.LittleEndian.Uint64(b[metaTxidOff:]) == uint64(tx.ID()) {
			freelist = binary.LittleEndian.Uint64(b[metaFreelistOff:])
			high = binary.LittleEndian.Uint64(b[metaHighOff:])
		}
	}
	if freelist == noFreelist {
		return nil
	}
	h, err := read(freelist, 0, pageHeaderSize)
	if err != nil {
		return err
	}
	if id, flags := binary.LittleEndian.Uint64(h), binary.LittleEndian.Uint16(h[8:]); id != freelist || flags != freelistPageFlag {
		return fmt.Errorf("%w: freelist page %d identifies itself as page %d with flags %#x", ErrCorrupt, freelist, id, flags)
	}
	// The page's count, or 0xFFFF and the count in the first entry.
	n, skip := uint64(binary.LittleEndian.Uint16(h[10:])), int64(0)
	if n == 0xFFFF {
		c, err := read(freelist, pageHeaderSize, 8)
		if err != nil {
			return err
		}
		n, skip = binary.LittleEndian.Uint64(c), 8
	}
	overflow := uint64(binary.LittleEndian.Uint32(h[12:]))
	if n > (overflow+1)*uint64(pageSize)/8 {
		return fmt.Errorf("%w: freelist page %d lists %d pages, more than it holds", ErrCorrupt, freelist, n)
	}
	ids, err := read(freelist, pageHeaderSize+skip, int(n)*8)
	if err != nil {
		return err
	}
	prev := uint64(1)
	for i := range n {
		id := binary.LittleEndian.Uint64(ids[i*8:])
		if id <= prev || id >= high {
			return fmt.Errorf("%w: freelist page %d is damaged: entry %d is page %d (after %d; the file has %d pages)", ErrCorrupt, freelist, i, id, prev, high)
		}
		prev = id
	}
	return nil
}
