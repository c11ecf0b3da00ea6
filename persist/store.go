package persist

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/devicegate/devicegate/devicelimit"
)

// FileName is the name of the data file in the data directory.
const FileName = "devicegate.db"

// SchemaVersion is the layout version this package writes. Open refuses
// files with a higher version (ErrNewerSchema).
const SchemaVersion = 1

// DefaultLockTimeout is how long Open waits for the data file's lock.
const DefaultLockTimeout = time.Second

// Bucket names. A file written before deferred messages has no
// "deferred" bucket: the first Enqueue creates it, and until then the
// store reads as holding none.
var (
	bucketWindows   = []byte("windows")
	bucketOverrides = []byte("overrides")
	bucketMeta      = []byte("meta")
	bucketDeferred  = []byte("deferred")
	bucketForward   = []byte("forward") // a bucket per forward log (forward.go)
)

// Options configures Open. The zero value is ready to use.
type Options struct {
	// LockTimeout is how long Open waits for another process to release
	// the data file's lock before failing with ErrInUse;
	// DefaultLockTimeout when <= 0.
	LockTimeout time.Duration
	// Logger receives the store's events (overrides skipped at restore);
	// nil discards them. Snapshotters take their own.
	Logger *slog.Logger
	// Check says when Open runs the consistency check (Store.Check) on
	// an existing file; the zero value checks at every Open.
	Check CheckMode
	// MinFreeBytes is the free-space floor: appends (forward log
	// records, deferred messages) are refused with ErrLowSpace, and
	// Health fails, while the free space of the data directory's
	// filesystem plus the file's free pages, less what the append may
	// take, is below it. 0: no floor. Not enforced where the free space
	// cannot be known (statfs: Linux, macOS, FreeBSD only).
	MinFreeBytes int64
	// DiskFree, when set, replaces the filesystem's answer (statfs) of
	// how many bytes are free in dir: tests fill a disk with it.
	DiskFree func(dir string) (free int64, ok bool)
}

// Meta is the store's meta data as read by Open.
type Meta struct {
	// Schema is the file's layout version.
	Schema int
	// HighWater is the logical clock's high-water written with the last
	// snapshot, 0 when the file is new. Start the clock at
	// max(wall clock, HighWater).
	HighWater devicelimit.Tick
	// CleanShutdown reports that the previous run ended with a final
	// snapshot (Snapshotter.Close), so no admission was lost.
	CleanShutdown bool
	// New reports that this Open created the store.
	New bool
	// Checked is how long Open's consistency check took; 0 when it did
	// not run (a new file, or Options.Check said not to).
	Checked time.Duration
}

// Store is the gateway's bbolt data file, opened by Open. One process at
// a time holds it (a file lock). Safe for concurrent use.
type Store struct {
	db   *bolt.DB
	dir  string
	path string
	log  *slog.Logger
	meta Meta

	overrideMu sync.Mutex // orders override writes with their Resolver updates
	commit     *committer // group commit of deferred messages
	delChunk   int        // the most keys DeleteDeferred deletes per transaction
	closed     atomic.Bool
	health     health
	space      *space
	closeOnce  sync.Once
	closeErr   error
}

// Open opens the store in dir, creating the directory (mode 0700) and
// the data file (mode 0600) when missing, checks its schema and reads
// its meta data. A file that is corrupt, truncated or not a store fails
// with ErrCorrupt, one of a newer schema with ErrNewerSchema; such a file
// is left exactly as it was. When another process holds the file, Open
// fails with ErrInUse after opts.LockTimeout.
func Open(dir string, opts Options) (*Store, error) {
	if dir == "" {
		return nil, errors.New("open store: empty data directory path")
	}
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fi, err := os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		return nil, fmt.Errorf("open store: data directory %q is not a directory", dir)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("open store: %w", err)
	}
	createdDir := err != nil
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open store: create data directory: %w", err)
	}
	path := filepath.Join(dir, FileName)
	fi, err = os.Stat(path)
	switch {
	case err == nil && !fi.Mode().IsRegular():
		return nil, fmt.Errorf("open store %q: not a regular file", path)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("open store: %w", err)
	}
	createdFile := false
	switch {
	case err != nil:
		// No file: lay out a new store under a temporary name and link it
		// into place once complete, so that any file found under the
		// data file's name is one this package finished writing.
		if createdFile, err = create(dir, path); err != nil {
			return nil, fmt.Errorf("open store %q: create: %w", path, err)
		}
	case fi.Size() == 0:
		// bbolt would lay out a fresh file in it, and every device would
		// get its whole quota again.
		return nil, fmt.Errorf("open store %q: %w: the file is empty (0 bytes)", path, ErrCorrupt)
	}

	db, err := openBolt(path, timeout)
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("data directory %q is %w (lock on %q held)", dir, ErrInUse, path)
	case err != nil:
		return nil, fmt.Errorf("open store %q: %w", path, err)
	}
	s := &Store{db: db, dir: dir, path: path, log: log, delChunk: deleteChunk}
	if err := guard(s.init); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %q: %w", path, err)
	}
	s.meta.New = createdFile
	if !s.meta.New && (opts.Check == CheckAlways || opts.Check == CheckAfterCrash && !s.meta.CleanShutdown) {
		start := time.Now()
		if err := s.Check(); err != nil {
			db.Close()
			return nil, err
		}
		s.meta.Checked = time.Since(start)
	} else if !s.meta.New {
		// Without the whole check, still never write through a damaged
		// freelist.
		err := guard(func() error {
			return db.View(func(tx *bolt.Tx) error { return s.checkFreelist(tx, false) })
		})
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("check store %q: %w", path, err)
		}
	}
	// A new file's directory entry (and a new directory's) must be as
	// durable as the first transactions written into the file.
	if createdFile {
		syncDirs := []string{dir}
		if createdDir {
			syncDirs = append(syncDirs, filepath.Dir(filepath.Clean(dir)))
		}
		for _, d := range syncDirs {
			if err := syncDir(d); err != nil {
				db.Close()
				return nil, fmt.Errorf("open store %q: %w", path, err)
			}
		}
	}
	s.space = &space{dir: dir, floor: max(opts.MinFreeBytes, 0), log: log, now: time.Now, free: opts.DiskFree,
		freeInFile: func() int64 { return int64(db.Stats().FreeAlloc) }}
	s.commit = newCommitter(db, func(err error, size int) { s.health.note(err, size, time.Now, s.log, s.path) })
	s.commit.space = s.space
	s.space.check(0) // a disk below the floor shows at once, before any append
	return s, nil
}

// syncDir fsyncs the directory dir, making the entries created in it
// durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %q: %w", dir, err)
	}
	return nil
}

// openBolt opens the bbolt file at path. Errors about the file's content
// wrap ErrCorrupt. A damaged file can make bbolt panic or fault on its
// memory map while opening: that becomes ErrCorrupt too, and the file is
// closed, which releases its lock.
func openBolt(path string, timeout time.Duration) (*bolt.DB, error) {
	var file *os.File
	opts := &bolt.Options{
		Timeout: timeout,
		// The hashmap freelist finds a run of free pages without
		// scanning the whole list, as the default array does for every
		// allocation. At a million windows (some thousands of free
		// pages) the two measure the same; the array falls behind as
		// the file and its freelist grow. The file format is the same.
		FreelistType: bolt.FreelistMapType,
		// Map a gigabyte of address space from the start (not memory:
		// the file grows as written), so that growing the file does not
		// remap it. A remap copies every key and value of the write
		// transaction out of the old map, which for a snapshot of a
		// million new windows costs a quarter of its time.
		InitialMmapSize: 1 << 30,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	var db *bolt.DB
	err := guard(func() error {
		var err error
		db, err = bolt.Open(path, 0o600, opts)
		return err
	})
	if err != nil && db == nil && file != nil && errors.Is(err, ErrCorrupt) {
		file.Close() // a panic left bbolt's file open and locked
	}
	var pathErr *fs.PathError
	switch {
	case err == nil, errors.Is(err, berrors.ErrTimeout), errors.Is(err, ErrCorrupt):
		return db, err
	case errors.As(err, &pathErr):
		return nil, err // cannot open the file: permissions, I/O
	default:
		// bbolt's content errors (ErrInvalid, ErrChecksum,
		// ErrVersionMismatch, "file size too small"...).
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
}

// guard runs fn, turning a panic in bbolt over damaged pages, or a fault
// reading the memory map past the end of a truncated file, into an error
// wrapping ErrCorrupt.
func guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			err = fmt.Errorf("%w: memory fault reading the mapped file at %#x (truncated or damaged)", ErrCorrupt, f.Addr())
			return
		}
		err = fmt.Errorf("%w: %v", ErrCorrupt, r)
	}()
	return fn()
}

// init checks a freshly opened file and reads its meta data. Nothing is
// written to the file.
func (s *Store) init() error {
	return s.db.View(func(tx *bolt.Tx) error {
		// A truncated file maps past its end: reading those pages would
		// fault. bbolt grows the file before it commits pages beyond it.
		st, err := os.Stat(s.path)
		if err != nil {
			return err
		}
		if need := tx.Size(); st.Size() < need {
			return fmt.Errorf("%w: truncated: %d bytes, the database needs %d", ErrCorrupt, st.Size(), need)
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("%w: no %q bucket", ErrCorrupt, bucketMeta)
		}
		m, err := decodeMeta(meta.Get(keySchema), meta.Get(keyClock), meta.Get(keyClean))
		if err != nil {
			return err
		}
		for _, name := range [][]byte{bucketWindows, bucketOverrides} {
			if tx.Bucket(name) == nil {
				return fmt.Errorf("%w: no %q bucket", ErrCorrupt, name)
			}
		}
		s.meta = m
		return nil
	})
}

// tempPrefix names the files create lays out new stores in.
const tempPrefix = FileName + ".new-"

// create lays out an empty store (its buckets and meta data) in a
// temporary file in dir, syncs it and links it to path. It reports false
// when another process linked its own store there first. Temporary files
// left by a creation that was cut off are removed.
func create(dir, path string) (created bool, err error) {
	stale, _ := filepath.Glob(filepath.Join(dir, tempPrefix+"*"))
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return false, err
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp)
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return false, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketWindows, bucketOverrides, bucketMeta, bucketDeferred} {
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		for _, kv := range [][2][]byte{
			{keySchema, encodeSchema(SchemaVersion)},
			{keyClock, encodeClock(0)},
			{keyClean, encodeClean(false)},
		} {
			if err := meta.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	// The commit synced the file's pages; link never replaces a file.
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, err
	}
	for _, name := range stale {
		os.Remove(name)
	}
	return true, nil
}

// Path returns the data file's path.
func (s *Store) Path() string { return s.path }

// Meta returns the meta data as read by Open.
func (s *Store) Meta() Meta { return s.meta }

// MarkRunning durably clears the clean-shutdown flag, so that a crash
// from now on is seen at the next Open, and records now as the clock's
// high-water if it is later (a crash before the first snapshot then
// knows when the run began). Call it after restoring state and before
// serving; Snapshotter.Close sets the flag again.
func (s *Store) MarkRunning(now devicelimit.Tick) error {
	err := s.update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if now > s.meta.HighWater {
			if err := meta.Put(keyClock, encodeClock(now)); err != nil {
				return err
			}
		}
		return meta.Put(keyClean, encodeClean(false))
	})
	if err != nil {
		return fmt.Errorf("mark store %q running: %w", s.path, err)
	}
	return nil
}

// Close closes the data file, waiting for transactions in progress.
// Enqueue and DeleteDeferred calls already waiting for their transaction
// complete first (or fail) before Close returns; later ones, like every
// other operation, fail with ErrClosed. Closing a closed store does
// nothing. Close does not write a snapshot: close the Snapshotter first.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.commit.close()
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("close store %q: %w", s.path, err)
		}
	})
	return s.closeErr
}

// update runs fn in a read-write transaction, committed and fsynced when
// update returns nil.
func (s *Store) update(fn func(*bolt.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	err := guard(func() error { return closedErr(s.db.Update(fn)) })
	s.health.note(err, unknownSize, time.Now, s.log, s.path)
	return err
}

// view runs fn in a read-only transaction.
func (s *Store) view(fn func(*bolt.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return guard(func() error { return closedErr(s.db.View(fn)) })
}

func closedErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// keyName formats a device key for an error message, shortened when
// long.
func keyName(k []byte) string {
	const max = 80
	if len(k) > max {
		return fmt.Sprintf("%q... (%d bytes)", k[:max], len(k))
	}
	return fmt.Sprintf("%q", k)
}
