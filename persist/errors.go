package persist

import "errors"

// Sentinel errors. Open and the other operations wrap them with the data
// file's path and the cause, so callers test with errors.Is and show
// err.Error() to people.
var (
	// ErrInUse reports that another process holds the data file's lock.
	ErrInUse = errors.New("in use by another gateway")
	// ErrCorrupt reports a data file that cannot be read as a store: not a
	// bbolt file, truncated, checksum failures, missing buckets or meta
	// data, or a record that does not decode.
	ErrCorrupt = errors.New("corrupt data file")
	// ErrNewerSchema reports a data file written with a schema version
	// above SchemaVersion, by a newer gateway.
	ErrNewerSchema = errors.New("data file has a newer schema")
	// ErrClosed reports an operation on a closed Store or Snapshotter.
	ErrClosed = errors.New("store closed")
	// ErrLowSpace reports an append refused because the room left for
	// the data file is below Options.MinFreeBytes.
	ErrLowSpace = errors.New("data file's disk below its free-space floor")
	// ErrNotHeld reports an entry asked for by its number that the log
	// does not hold (a dead letter deleted meanwhile).
	ErrNotHeld = errors.New("not held")
)
