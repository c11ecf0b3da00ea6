package persist

import (
	"fmt"
	"io"
	"os"

	bolt "go.etcd.io/bbolt"
)

// Backup writes a consistent copy of the data file to w while the
// gateway serves: it writes a snapshot of the windows changed since the
// last one, then copies the file from a read transaction begun before
// the next snapshot can start (bbolt's Tx.WriteTo), so the copy holds
// every window, quota override, block, deferred message and forward
// log entry as of that instant. Writers are not held up by the copy.
// The copy is marked as shut down cleanly: a gateway started on it
// restores it as it is, without the crash charge of an unclean file
// (the admissions it lacks are those made after the backup). It goes
// through a temporary file in the data directory, removed before Backup
// returns. Backup returns the bytes written to w.
func (sn *Snapshotter) Backup(w io.Writer) (int64, error) {
	tmp, err := os.CreateTemp(sn.store.dir, FileName+".backup-*")
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()

	if err := sn.copyTo(tmp); err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	db, err := bolt.Open(tmp.Name(), 0o600, &bolt.Options{Timeout: DefaultLockTimeout})
	if err != nil {
		return 0, fmt.Errorf("backup: reopen the copy: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyClean, encodeClean(true))
	})
	if err == nil {
		err = (&Store{db: db, path: tmp.Name()}).Check()
	}
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("backup: the copy: %w", err)
	}
	f, err := os.Open(tmp.Name())
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	return io.Copy(w, f)
}

// copyTo takes a snapshot and copies the file as of it to f. The read
// transaction begins with the snapshotter held, so no snapshot comes
// between; the copy itself runs after, the snapshots going on.
func (sn *Snapshotter) copyTo(f *os.File) error {
	sn.mu.Lock()
	if sn.closed {
		sn.mu.Unlock()
		return ErrClosed
	}
	if _, err := sn.snapshot(false); err != nil {
		sn.mu.Unlock()
		return fmt.Errorf("snapshot: %w", err)
	}
	if sn.store.closed.Load() {
		sn.mu.Unlock()
		return ErrClosed
	}
	tx, err := sn.store.db.Begin(false)
	sn.mu.Unlock()
	if err != nil {
		return closedErr(err)
	}
	defer tx.Rollback()
	return guard(func() error {
		_, err := tx.WriteTo(f)
		return err
	})
}
