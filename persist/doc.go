// Package persist keeps the gateway's durable state in one bbolt file,
// FileName, under the data directory: the devices' sliding windows, the
// runtime quota overrides, and meta data (schema version, clock
// high-water, clean-shutdown flag).
//
// # Durability
//
// Quota overrides are written through: SetOverride and DeleteOverride
// return only after the change is committed and fsynced, and only then
// apply it to the Resolver. Windows are written behind: a Snapshotter
// writes the windows changed since its last snapshot every interval
// (default 1 s), so a crash (kill -9, power loss) loses at most the
// admissions of the last interval, plus those of any snapshots that were
// failing at the time (a failed snapshot is retried, never dropped). A
// graceful Snapshotter.Close writes a final snapshot and sets the
// clean-shutdown flag, so a restart after it loses nothing.
//
// Every snapshot also records the clock high-water, the logical clock
// read after the windows were collected. The gateway starts its clock at
// max(wall clock, high-water), so a wall clock set back while the gateway
// was down cannot empty a window.
//
// # Failure
//
// A data file that is corrupt, truncated, unreadable or written by a
// newer schema makes Open fail with an error naming the file; it is never
// replaced or repaired. A second gateway on the same data directory fails
// to Open with ErrInUse once the lock timeout passes.
//
// # Layout
//
// Buckets: "windows" (device ID → devicelimit.Window encoding),
// "overrides" (device ID → override encoding, see encode.go), "meta"
// (keys "schema", "clock", "clean"). Device IDs longer than
// bbolt.MaxKeySize (32768 bytes) cannot be keys: their windows are not
// persisted (see SnapshotStats.Skipped) and overrides for them are refused.
package persist
