//go:build linux

package qrpc

import (
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// exchange runs one exchange of a step by hand: the ops Go asked for
// against s, their results back to Go. It returns the next ops and
// whether Go wants their results.
func exchangeOnce(p *Pool, s *memStore, prefix string, ops []StoreOp) ([]StoreOp, bool) {
	return p.ShareStep(0, s.run(prefix, ops))
}

// TestShareTakeoverLoserWatchesWinner: the probe lease's holder dies
// (its process exited); two views that heard it step at once, and the
// one that loses the takeover token (the other set the lease first)
// must then watch the winner's process like any holder's: when the
// winner dies in turn, the loser takes the lease over at once. A loser
// that went back to sleep until the dead holder's lease would have ended
// (its record's end, up to 2.5 renewal intervals, 75 s with check =
// 2000), without watching the winner, would leave the pool with no
// prober until then after a second holder death (35 s in this test).
func TestShareTakeoverLoserWatchesWinner(t *testing.T) {
	// the first holder: a process that has exited already
	deadCmd := exec.Command("true")
	if err := deadCmd.Run(); err != nil {
		t.Skipf("no true to run: %v", err)
	}
	// the winner's process: alive until the test kills it
	winner := exec.Command("sleep", "60")
	if err := winner.Start(); err != nil {
		t.Skipf("no sleep to run: %v", err)
	}
	t.Cleanup(func() { _ = winner.Process.Kill(); _ = winner.Wait() })

	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	const interval = time.Second // lease period 1 s: renewal 16 s, TTL 40 s
	views, asked := checkViews(t, clk, 2, 3, interval, 100*time.Millisecond)
	f1, f2 := views[0], views[1]
	// f1 is the view of the winner's process (an id names its pid)
	f1.share.mu.Lock()
	f1.share.sh.id = strconv.Itoa(winner.Process.Pid) + "-f1"
	f1.share.mu.Unlock()

	// The probe lease, held by the dead process's view, renewed just now.
	ttl := time.Duration(leaseTTLFactor * float64(leaseRenew(interval)))
	deadID := strconv.Itoa(deadCmd.ProcessState.Pid()) + "-dead"
	s.run("x:", []StoreOp{{Kind: OpSet, Key: "lp" + f1.listScope(), Value: leaseValue(deadID, f1.hostNS(clk.Now())+int64(ttl)), TTL: ttl}})

	// Both views step at once (both heard the exit): f2 reads the lease
	// first, f1's whole step (token won, lease set) runs before f2 tries
	// the token.
	ops, more := f2.ShareStep(ShareStep, nil)
	for more {
		ops, more = exchangeOnce(f2, s, "x:", ops)
		if more && len(ops) > 0 && ops[0].Kind == OpAdd {
			break // f2's token add, not run yet
		}
	}
	stepView(f1, s, "x:", ShareStep)
	if f1.share.noProbe.Load() {
		t.Fatalf("f1 did not take the dead holder's lease (store %v)", s.keys())
	}
	for more {
		ops, more = exchangeOnce(f2, s, "x:", ops)
	}
	s.run("x:", ops)
	if !f2.share.noProbe.Load() {
		t.Fatal("f2 probes too: the setup went wrong")
	}

	// The winner's process dies. f2 must take the lease over soon; it is
	// stepped whenever it asks (as the host would), for 5 s of its clock
	// (the dead holder's lease ends 40 s after it was set).
	_ = winner.Process.Kill()
	_ = winner.Wait()
	took := time.Duration(-1)
	start := clk.Now()
	for clk.Now().Sub(start) < 5*time.Second {
		time.Sleep(2 * time.Millisecond) // the exit heard (a pidfd, Go's netpoller)
		clk.Advance(20 * time.Millisecond)
		if asked[1].Swap(false) {
			stepView(f2, s, "x:", ShareStep)
		}
		if !f2.share.noProbe.Load() {
			took = clk.Now().Sub(start)
			break
		}
	}
	if took < 0 {
		f2.share.mu.Lock()
		watch := time.Duration(f2.share.sh.watch[leaseProbe] - monoNS(clk.Now()))
		holder := f2.share.sh.holder[leaseProbe]
		f2.share.mu.Unlock()
		t.Fatalf("the takeover's winner died: the other view did not take the probe lease in 5 s; "+
			"it watches %q and steps again in %v (the dead first holder's lease end)", holder, watch.Round(time.Millisecond))
	}
	t.Logf("the other view took the lease %v after the winner died", took)
}

// TestShareTakeoverKeepsOtherLease: a dead holder's lease that is about
// to end when a view reads it. Taken over (token, then a set of the lease
// key), the set could land after the lease lapsed and another view added
// it, overwrite that lease, and leave two views probing until the one
// overwritten steps again: idle, at its next renewal (16 s here, 30 s
// with check = 2000). A lease that ends within takeoverMargin is left to
// lapse instead: at most one view probes.
func TestShareTakeoverKeepsOtherLease(t *testing.T) {
	deadCmd := exec.Command("true")
	if err := deadCmd.Run(); err != nil {
		t.Skipf("no true to run: %v", err)
	}
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	const interval = time.Second
	views, asked := checkViews(t, clk, 2, 3, interval, 100*time.Millisecond)
	f1, f2 := views[0], views[1]
	// the dead holder's lease, 10 ms from its end
	deadID := strconv.Itoa(deadCmd.ProcessState.Pid()) + "-dead"
	left := 10 * time.Millisecond
	s.run("x:", []StoreOp{{Kind: OpSet, Key: "lp" + f1.listScope(), Value: leaseValue(deadID, f1.hostNS(clk.Now())+int64(left)), TTL: left}})

	// f1 reads the lease (its holder's process is gone); the lease lapses
	// before f1's step goes on
	ops, more := f1.ShareStep(ShareStep, nil)
	for more {
		ops, more = exchangeOnce(f1, s, "x:", ops)
		if more && len(ops) > 0 && ops[0].Kind == OpAdd {
			break
		}
	}
	// (A view that asks for the token here would set the lease after
	// f2's add below.)
	clk.Advance(2 * left)
	// f2 steps meanwhile: the lease is free, it adds it
	stepView(f2, s, "x:", ShareStep)
	if f2.share.noProbe.Load() {
		t.Fatalf("f2 did not take the lapsed lease (store %v)", s.keys())
	}
	// f1's step goes on
	for more {
		ops, more = exchangeOnce(f1, s, "x:", ops)
	}
	s.run("x:", ops)

	// Both idle: stepped when they ask. How long do two views probe?
	both := time.Duration(0)
	for range 500 { // 10 s
		clk.Advance(20 * time.Millisecond)
		for i, p := range views {
			if asked[i].Swap(false) {
				stepView(p, s, "x:", ShareStep)
			}
		}
		if f1.roleHeld(leaseProbe) && f2.roleHeld(leaseProbe) {
			both += 20 * time.Millisecond
		}
	}
	if limit := 2 * interval; both > limit {
		t.Errorf("two views held the probe role for %v of 10 s after a takeover raced a lapsed lease's add: want at most %v", both, limit)
	}
}
