// Package devicelimit is the gateway's domain: a device's quota (N
// messages per window T, and what to do over it), the sliding window
// that enforces it, the table of every device's window, the logical
// clock, quota resolution (a runtime override, then the first matching
// rule, then the default) and the leases that pay for crashes. It
// imports the standard library only.
//
// The window. A window of length T is a ring of B+1 slots, one per
// bucket of width T/B, on the logical clock. A decision at tick now, in
// bucket nb, counts the buckets nb-B..nb, which cover (now-T, now]; it
// admits when fewer than N were counted. So in every interval of length
// T a device has at most N admissions: an admission at t sees every
// earlier one in (t-T, t]. A ring of only B slots would forget the partly
// expired oldest bucket and admit up to 2N in less than T; counting it
// whole costs a device that sends evenly faster than N per T*(1+1/B)
// about 1/B of its messages (window.go has the proof in full).
//
// The invariant holds across restarts because the clock starts at
// max(wall clock, persisted high-water) and the windows are restored
// from their snapshots (snapshot.go, collect.go), and across crashes
// because an admission is acted on only under a durable lease, and a
// window restored after a crash is charged what its open lease could
// have admitted beyond its snapshot, at the latest instant it could
// have (lease.go): at most one lease per window, nothing for a window
// without an open lease.
//
// Reads change nothing: PeekAt decides on a copy of the window. The
// table keeps windows in slabs of fixed-size records and allocates
// nothing on the decision path (AllowAt).
//
// docs/design.md puts the package in the gateway's design.
package devicelimit
