package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/devicelimit"
)

// admitted counts the messages of device g admits at now, up to n+1
// tried: one more than n shows a quota larger than n.
func admitted(g *ownerRig, device string, q devicelimit.Quota, n int, now devicelimit.Tick) int {
	k := 0
	for range n + 1 {
		if g.o.AllowAt(device, q, now).Allowed {
			k++
		}
	}
	return k
}

// TestOwnerResetSurvivesCrash: A admits a device's whole window (its
// checkpoints in Redis hold the counts), the operator resets the device
// on A, and A crashes at once (nothing released). B takes the device
// over: it must find the windows empty and admit the whole quota, as a
// restart of a single gateway does after a reset (persist.Reset).
func TestOwnerResetSurvivesCrash(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, time.Second)
	q := devicelimit.Quota{Limit: 6, Window: time.Hour}
	if n := admitted(a, "d", q, 6, t0); n != 6 {
		t.Fatalf("A admitted %d of a fresh window, want 6", n)
	}
	if had, err := a.o.Reset(ctxT(t), "d"); err != nil || !had {
		t.Fatalf("reset on the owner: got %v, %v, want true, nil", had, err)
	}
	crash(t, srv, a)
	b := newOwner(t, srv, 10, time.Second)
	if n := admitted(b, "d", q, 6, t0.Add(time.Second)); n != 6 {
		t.Fatalf("B admitted %d after the reset and A's crash, want the whole quota 6", n)
	}
}

// TestOwnerResetAdmitsAfterResetThenCrash: after a reset, the device
// publishes on A again (3 of 6) and A crashes: B charges what A's lease
// could have admitted beyond its checkpoint, as after any crash, and
// never more than the quota in the window.
func TestOwnerResetAdmitsAfterResetThenCrash(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, time.Second)
	q := devicelimit.Quota{Limit: 6, Window: time.Hour}
	admitted(a, "d", q, 6, t0)
	if _, err := a.o.Reset(ctxT(t), "d"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if !a.o.AllowAt("d", q, t0).Allowed {
			t.Fatalf("message %d after the reset refused", i)
		}
	}
	crash(t, srv, a)
	b := newOwner(t, srv, 10, time.Second)
	if n := admitted(b, "d", q, 6, t0.Add(time.Second)); n > 3 {
		t.Fatalf("B admitted %d after 3 admitted since the reset, want at most 3", n)
	}
}

// TestOwnerResetOnOtherGateway: A owns a device that used its whole
// window; the operator's reset reaches B, which does not own it. After
// the reset's answer the device is admitted its whole quota wherever it
// connects: B takes the device over (A releases it and closes its
// session there), empties its windows and writes that; the device
// reconnecting to A is claimed back with empty windows, and one
// reconnecting to B finds them empty too.
func TestOwnerResetOnOtherGateway(t *testing.T) {
	for _, back := range []string{"A", "B"} {
		t.Run("reconnects to "+back, func(t *testing.T) {
			srv := redistest.Start(t)
			a := newOwner(t, srv, 10, time.Second)
			b := newOwner(t, srv, 10, time.Second)
			q := devicelimit.Quota{Limit: 6, Window: time.Hour}
			if n := admitted(a, "d", q, 6, t0); n != 6 {
				t.Fatalf("A admitted %d of a fresh window, want 6", n)
			}
			if _, err := b.o.Reset(ctxT(t), "d"); err != nil {
				t.Fatalf("reset on B: %v", err)
			}
			on := b
			if back == "A" {
				on = a
				if err := a.o.Claim("d"); err != nil { // its new connection on A
					t.Fatal(err)
				}
			}
			if n := admitted(on, "d", q, 6, t0.Add(time.Second)); n != 6 {
				t.Fatalf("%s admitted %d after the reset, want the whole quota 6", back, n)
			}
			// A closes the session after its release is written, which may
			// be after B's reset answered: waited for, with a deadline.
			deadline := time.Now().Add(10 * time.Second)
			for !slices.Contains(a.lostDevices(), "d") {
				if time.Now().After(deadline) {
					t.Fatalf("A was not told to close the device's session (lost %v)", a.lostDevices())
				}
				time.Sleep(time.Millisecond) // polling a condition, not letting time pass
			}
		})
	}
}

// ctxT returns a context ending with the test, bounded to a minute.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestOwnerResetRedisFrozen: Redis stops answering (SIGSTOP) while the
// owner resets a device that used its window: the reset empties the
// owner's windows but its checkpoint is not written, and it says so
// (ErrResetNotWritten). Redis back, a reset repeated until Redis is
// tried again answers false (nothing left to empty) and writes what the
// first one left: A's crash then leaves B the windows empty.
func TestOwnerResetRedisFrozen(t *testing.T) {
	srv := redistest.Start(t)
	a := newOwner(t, srv, 10, 2*time.Second)
	q := devicelimit.Quota{Limit: 6, Window: time.Hour}
	if n := admitted(a, "d", q, 6, t0); n != 6 {
		t.Fatalf("A admitted %d of a fresh window, want 6", n)
	}
	srv.Stop()
	had, err := a.o.Reset(ctxT(t), "d")
	srv.Cont()
	if !had || !errors.Is(err, ErrResetNotWritten) {
		t.Fatalf("reset with Redis frozen: got %v, %v, want true and ErrResetNotWritten", had, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		had, err = a.o.Reset(ctxT(t), "d")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reset after Redis came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling until Redis is tried again, not letting logical time pass
	}
	if had {
		t.Fatal("the repeated reset found windows: the first did not empty them")
	}
	crash(t, srv, a)
	b := newOwner(t, srv, 10, 2*time.Second)
	if n := admitted(b, "d", q, 6, t0.Add(time.Second)); n != 6 {
		t.Fatalf("B admitted %d after the repeated reset and A's crash, want the whole quota 6", n)
	}
}
