package hostq

import (
	"runtime"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

func echoCmd(id uint64) *bridge.CmdABI {
	return &bridge.CmdABI{Version: bridge.CmdVersion, Op: bridge.OpEcho, CallID: id}
}

// waitSubmitterAsleep waits, bounded, until the submitter has found the
// queue empty and sleeps.
func waitSubmitterAsleep(t *testing.T) {
	t.Helper()
	testwait.Until(t, "the submitter asleep", 10*time.Second, func() bool {
		n, asleep, _ := submitterState()
		return n == 0 && asleep
	})
}

// TestPickupRunsWhatDidNotRing: once the waker has armed its pickup, a
// push does not ring the submitter (the call stays queued: nothing else
// would run it) and the pickup runs it; after it the submitter is marked
// asleep again, so that the next push rings and runs.
func TestPickupRunsWhatDidNotRing(t *testing.T) {
	d := openBuiltin(t)
	s := &builtin.submitq
	waitSubmitterAsleep(t)
	_, _, rings := submitterState()
	armPickup()
	if st := pushAsync(echoCmd(10)); st != bridge.StatusPending {
		t.Fatalf("push: %d", st)
	}
	if n, asleep, r := submitterState(); n != 1 || asleep || r != rings {
		t.Fatalf("after an armed push: %d queued, asleep %v, %d rings; want 1 queued, not asleep, no ring", n, asleep, r-rings)
	}
	s.mu.Lock()
	f := s.f
	s.mu.Unlock()
	s.pickup(f)
	if c := d.wait(10, 10*time.Second); c.Status != bridge.StatusOK {
		t.Fatalf("picked-up echo: %d %q", c.Status, text(c))
	}
	// and the echo's completion kicked the waker, whose own pickup
	// follows its wake byte: bounded wait
	waitSubmitterAsleep(t)
	// the next push rings the submitter
	if st := pushAsync(echoCmd(11)); st != bridge.StatusPending {
		t.Fatalf("push: %d", st)
	}
	if c := d.wait(11, 10*time.Second); c.Status != bridge.StatusOK {
		t.Fatalf("echo after the pickup: %d %q", c.Status, text(c))
	}
}

// TestSequentialEchoesThroughPickup plays nginx's side of sequential
// echoes on one CPU (playNginx with one in flight: each completes once)
// and logs how many pushes found the submitter asleep and so rang it:
// with the waker's pickup few do, as the thread that submits runs
// between the wake byte and the pickup. A scheduling figure: logged,
// not asserted.
func TestSequentialEchoesThroughPickup(t *testing.T) {
	if raceEnabled {
		t.Skip("scheduling is not measured under the race detector")
	}
	procs := runtime.GOMAXPROCS(2) // the submitter must not need the polling thread's P
	t.Cleanup(func() { runtime.GOMAXPROCS(procs) })
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pinToOneCPU(t)
	d := openBuiltin(t)
	waitSubmitterAsleep(t)
	const total = 5000
	id := uint64(1000)
	_, _, rings := submitterState()
	playNginx(t, d, 1, total, func() {
		if st := pushAsync(echoCmd(id)); st != bridge.StatusPending {
			t.Fatalf("push %d: %d", id, st)
		}
		id++
	})
	_, _, now := submitterState()
	t.Logf("%d sequential echoes, %d pushes rang the submitter", total, now-rings)
}
