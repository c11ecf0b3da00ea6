// Package persist keeps the gateway's durable state in one bbolt file,
// FileName, under the data directory: the devices' sliding windows, the
// runtime quota overrides, the deferred messages, and meta data (schema
// version, clock high-water, clean-shutdown flag).
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
// Deferred messages are written through too, with group commit: Enqueue
// returns only after the transaction holding the message is committed
// and fsynced, so a message acked after Enqueue survives kill -9 and
// power loss. One goroutine commits every enqueue (and DeleteDeferred)
// queued while its previous transaction was written, in one transaction
// with one pair of fsyncs: the batch grows with the load and an idle
// store adds no delay. It beats bbolt's DB.Batch, whose timer makes
// publishers that wait for their ack wait for it too (BenchmarkEnqueue,
// 50 publishers: 21-27k enqueues/s against 4k with the default 10 ms
// delay and 15-17k with 1 ms; one transaction per message, 6-7k). Snapshots share
// bbolt's single writer with it: while messages wait, a snapshot ends its
// transaction after 10 ms and lets them go first. Releasing is
// at-least-once: a crash between a release and its DeleteDeferred
// releases the message again after the restart.
//
// Every snapshot also records the clock high-water, the logical clock
// read after the windows were collected. The gateway starts its clock at
// max(wall clock, high-water), so a wall clock set back while the gateway
// was down cannot empty a window.
//
// # Start and stop
//
//	s, err := persist.Open(dir, persist.Options{Logger: log})
//	clock := devicelimit.NewSystemClock(s.Meta().HighWater)
//	s.RestoreWindows(table)                  // before decisions start
//	s.RestoreOverrides(resolver, clock.Now())
//	s.LoadDeferred(queue.add)                 // rebuild the deferral queues
//	s.MarkRunning(clock.Now())               // a crash from here is seen
//	sn := persist.NewSnapshotter(s, table, clock, interval, log)
//	sn.Start()
//	... serve; quota changes through s.SetOverride / s.DeleteOverride,
//	    deferred messages through s.Enqueue / s.DeleteDeferred ...
//	sn.Close(ctx)                             // after the broker stops
//	s.Close()                                 // completes queued enqueues
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
// varint expiry tick, 0 for never), "deferred" (the device ID's length
// as a uvarint, the ID and the sequence number as 8 bytes big-endian →
// the message as the broker encoded it: a device's messages are
// contiguous and in sequence order; files from before deferred messages
// lack the bucket until the first Enqueue) and "meta" (keys "schema":
// uvarint version; "clock": 8-byte big-endian high-water tick; "clean":
// one byte, 0 or 1). Every decoder accepts only the canonical encoding.
// Device IDs longer than bbolt.MaxKeySize (32768 bytes) cannot be keys:
// their windows and overrides are kept in "windows-long" and
// "overrides-long", keyed by the SHA-256 of the ID, the value being the
// ID's length as a uvarint, the ID (checked against the key on restore)
// and the usual encoding; they are persisted and restored like any
// other. Files from before them lack these buckets until the first such
// write. Messages of IDs longer than MaxDeferredDevice (32750 bytes)
// still cannot be deferred. "deferred-damaged" holds, under the same
// keys and with the same records, the deferred messages the broker set
// aside as damaged (SetAsideDeferred); "forward" and "forward-dead" a
// bucket per forward log and its dead letters.
//
// # Free space
//
// With Options.MinFreeBytes, appends (forward log records, deferred
// messages) are refused with ErrLowSpace, and Health fails, while the
// room left for the file (its filesystem's free space, by statfs, plus
// the file's free pages) less what they may take is below that floor:
// the disk never fills with them (see space.go).
package persist
