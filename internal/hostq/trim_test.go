package hostq

import (
	"bytes"
	"testing"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge/cmdtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bufcache"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// bufcacheBudget is cmem's budget.
const bufcacheBudget = bufcache.DefaultBudget

// trimmerIdle reports whether the trimmer stopped its timer and every
// cache it empties is empty.
func trimmerIdle() bool {
	if builtin.submitq.trimOn.Load() || cmem.Stats().Bytes != 0 || submitqCached() != 0 {
		return false
	}
	for c := 0; c < smallClasses; c++ {
		if smallKept(c) != 0 {
			return false
		}
	}
	return true
}

// echoBurst runs n echo commands of size bytes through the submit queue,
// collects their results and releases them as Lua does (qrpc_release_n).
func echoBurst(t *testing.T, d *dispatcher, first uint64, n, size int) {
	t.Helper()
	body := bytes.Repeat([]byte("t"), size)
	for i := 0; i < n; i++ {
		e := &bridge.CmdABI{Version: bridge.CmdVersion, Op: bridge.OpEcho, CallID: first + uint64(i)}
		e.Body, e.BodyLen = cmdtest.Ptr(body)
		if st := pushAsync(e); st != bridge.StatusPending {
			t.Fatalf("echo %d: %d", i, st)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(d.got) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d results", len(d.got), n)
		}
		d.pump(100 * time.Millisecond)
	}
	var ps []unsafe.Pointer
	for id, c := range d.got {
		if c.Status != bridge.StatusOK || int(c.Len) < size {
			t.Fatalf("echo %d: status %d, %d bytes", id, c.Status, c.Len)
		}
		ps = append(ps, c.Data)
		delete(d.got, id)
	}
	releaseN(ps)
}

// TestTrimmerStopsAndRestarts: after a burst the trimmer gives back every
// block the burst left and then stops its timer (an idle worker is not
// woken twice a second); the next command starts it again and it trims
// that command's blocks; a release on its own while it sleeps is freed at
// once and wakes nothing.
func TestTrimmerStopsAndRestarts(t *testing.T) {
	d := openBuiltin(t)
	// Big results (bufcache), big commands (hostq.c's list) and small
	// results and commands (the small lists): every cache gets blocks.
	echoBurst(t, d, 1000, 40, 100<<10)
	echoBurst(t, d, 2000, 40, 4<<10)
	if cmem.Stats().Blocks == 0 && submitqCached() == 0 {
		// The trimmer ticks while blocks are kept, so a slow machine may
		// have emptied them already; then the burst proves nothing.
		t.Log("no blocks kept right after the burst")
	}
	testwait.Until(t, "the trimmer to give back the burst's blocks and stop", 60*time.Second, trimmerIdle)

	// Stopped means no timer: no tick in three periods, counted by a
	// reference ticker of the same period in this runtime (three of its
	// ticks mean Go has run its timers for three periods, however loaded
	// the machine; a trimmer timer left armed would have fired first).
	n := builtin.submitq.trims.Load()
	if got := threePeriods(d); got != n || builtin.submitq.trimOn.Load() {
		t.Fatalf("stopped trimmer ticked %d times (on: %v)", got-n, builtin.submitq.trimOn.Load())
	}

	// A command starts it again; it stops again once that is trimmed.
	echoBurst(t, d, 3000, 20, 100<<10)
	testwait.Until(t, "the trimmer to tick after a command", 30*time.Second, func() bool { return builtin.submitq.trims.Load() > n })
	testwait.Until(t, "the trimmer to stop again", 60*time.Second, trimmerIdle)

	// A release alone (no command) while it sleeps frees its blocks at
	// once: nothing kept, so nothing for the trimmer to wake for (an idle
	// worker's shared-pool steps and queries release their answers so).
	big, small := cmem.Alloc(100<<10), smallAlloc(40)
	n = builtin.submitq.trims.Load()
	releaseN([]unsafe.Pointer{big, small})
	qlock()
	rel := hq.rel_head
	qunlock()
	if k := smallKept(0); k != 0 || rel != nil {
		t.Fatalf("a release while the trimmer sleeps kept %d small blocks and a big one: %v", k, rel != nil)
	}
	if got := threePeriods(d); got != n || builtin.submitq.trimOn.Load() {
		t.Fatalf("a release woke the sleeping trimmer: %d ticks (on: %v)", got-n, builtin.submitq.trimOn.Load())
	}
}

// threePeriods pumps d for three trimmer periods, counted by a reference
// ticker of the same period in this runtime, and returns the trimmer's
// ticks then.
func threePeriods(d *dispatcher) uint64 {
	ref := time.NewTicker(trimEvery)
	defer ref.Stop()
	for ticks := 0; ticks < 3; {
		d.pump(trimEvery)
		select {
		case <-ref.C:
			ticks++
		default:
		}
	}
	return builtin.submitq.trims.Load()
}

// TestTrimmerTicksUnderLoad: while commands keep coming the trimmer never
// stops, so a long run of calls is trimmed as it goes and its caches stay
// within their budgets.
func TestTrimmerTicksUnderLoad(t *testing.T) {
	d := openBuiltin(t)
	n := builtin.submitq.trims.Load()
	id := uint64(5000)
	for end := time.Now().Add(4 * trimEvery); time.Now().Before(end) || builtin.submitq.trims.Load() < n+3; {
		echoBurst(t, d, id, 8, 100<<10)
		id += 8
		if !builtin.submitq.trimOn.Load() {
			t.Fatal("the trimmer stopped while commands kept coming")
		}
		if b := cmem.Stats().Bytes; b > bufcacheBudget {
			t.Fatalf("the buffer cache holds %d bytes, over its budget", b)
		}
		if id > 5000+8*100000 {
			t.Fatal("no tick in 100000 bursts")
		}
	}
	testwait.Until(t, "the trimmer to stop after the load", 60*time.Second, trimmerIdle)
}
