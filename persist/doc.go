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
// admissions since the last successful snapshot: one interval, or more
// while snapshots fail (a failed snapshot is kept and retried, never
// dropped). A graceful Snapshotter.Close writes a final snapshot and sets
// the clean-shutdown flag, so a restart after it loses nothing.
//
// Every snapshot also records the clock high-water, the logical clock
// read after the windows were collected. The gateway starts its clock at
// max(wall clock, high-water), so a wall clock set back while the gateway
// was down cannot empty a window.
//
// # Start and stop
//
//	s, err := persist.Open(dir, persist.Options{Logger: log})
//	clock := devicelimit.NewSystemClock(s.Meta().HighWater, 0)
//	s.RestoreWindows(table)                  // before decisions start
//	s.RestoreOverrides(resolver, clock.Now())
//	s.MarkRunning()                           // a crash from here is seen
//	sn := persist.NewSnapshotter(s, table, clock, interval, log)
//	sn.Start()
//	... serve; quota changes through s.SetOverride / s.DeleteOverride ...
//	sn.Close(ctx)                             // after the broker stops
//	s.Close()
//
// # Failure
//
// A data file that is corrupt, truncated, unreadable or written by a
// newer schema makes Open fail with an error naming the file; it is never
// replaced or repaired, and Open writes nothing to it. A damaged record
// found later (by a restore) fails the same way, naming the device. A
// second gateway on the same data directory fails to Open with ErrInUse
// once the lock timeout passes.
//
// # Layout
//
// Buckets: "windows" (device ID → the window's encoding, see
// devicelimit.Window.MarshalBinary), "overrides" (device ID → version
// byte 1, uvarint limit, uvarint window in nanoseconds, policy byte,
// varint expiry tick, 0 for never) and "meta" (keys "schema": uvarint
// version; "clock": 8-byte big-endian high-water tick; "clean": one byte,
// 0 or 1). Every decoder accepts only the canonical encoding. The name "deferred" is reserved for deferred messages. Device
// IDs longer than bbolt.MaxKeySize (32768 bytes) cannot be keys: their
// windows are not persisted (see SnapshotStats.Skipped) and overrides for
// them are refused.
package persist
