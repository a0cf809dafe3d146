package qrpc

import (
	"strings"
	"testing"
	"time"
)

// TestReviewP2CSingleServerTierIgnoresAdmit: p2c over SRV tiers of one
// server each. The first tier's server is ejected (or excluded by a
// retry), yet balance's n == 1 branch returns it with admitNo and
// chooseIn treats any non-trial admission as a pick: the ejected server
// keeps taking every call and the backup tier idles.
func TestReviewP2CSingleServerTierIgnoresAdmit(t *testing.T) {
	p := tierPool(t, P2C, srvMeta{prio: 1, weight: 1}, srvMeta{prio: 2, weight: 1})
	peers := p.set.Load().peers
	for range 3 {
		p.transition(peers[0], event{kind: evFailure})
	}
	if !peers[0].h.Load().ejected() {
		t.Fatal("setup: first-tier server not ejected")
	}
	got := map[string]int{}
	for range 100 {
		pr, _ := p.pick(nil, nil, false, &pickClock{})
		if pr == nil {
			got["none"]++
			continue
		}
		got[pr.addr]++
	}
	if got[peers[0].addr] != 0 {
		t.Errorf("ejected first-tier server took %d of 100 calls (%v)", got[peers[0].addr], got)
	}
	// a retry that excludes the first-tier server goes back to it
	p.transition(peers[0], event{kind: evCheckOK})
	var ex exclude
	ex.add(peers[0])
	if pr, _ := p.pick(nil, &ex, false, &pickClock{}); pr == peers[0] {
		t.Errorf("retry excluded %s, picked it again instead of the backup tier", peers[0].addr)
	}
}

// TestReviewRunEndUndoesFresherEjection: view A synced a run of failures
// and then got an answer (the run ends: A's health is dirty, not
// ejected). View B's next failure completes the run and ejects, and B
// publishes generation N. A's step refuses N (dirty) and publishes its
// own "not ejected" as N+1; B imports N+1 and brings the server back.
// A stale "back" must never undo a fresher ejection.
func TestReviewRunEndUndoesFresherEjection(t *testing.T) {
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	var views []*Pool
	for i := range 2 {
		p, _ := fakePool(t, 3)
		p.clk = clk
		p.Share(ShareConfig{Slot: i, Slots: 2})
		views = append(views, p)
	}
	A, B := views[0], views[1]
	xa, xb := A.set.Load().peers[0], B.set.Load().peers[0]
	// two failures in B, published as the run
	B.outcome(xb, 0, errTimeoutForTest())
	B.outcome(xb, 0, errTimeoutForTest())
	stepView(B, s, "x:", ShareStep)
	stepView(A, s, "x:", ShareStep)
	if xa.h.Load().fails != 2 {
		t.Fatalf("setup: A did not take the run: %+v", *xa.h.Load())
	}
	// A: a (late) answer ends the run locally
	A.outcome(xa, 0, nil)
	// B: the third failure ejects
	B.outcome(xb, 0, errTimeoutForTest())
	stepView(B, s, "x:", ShareStep)
	if !xb.h.Load().ejected() {
		t.Fatalf("setup: B did not eject: %+v", *xb.h.Load())
	}
	t.Logf("B after eject: %+v", *xb.h.Load())
	clk.Advance(10 * time.Millisecond)
	stepView(A, s, "x:", ShareStep)
	t.Logf("A after its step: %+v", *xa.h.Load())
	clk.Advance(10 * time.Millisecond)
	stepView(B, s, "x:", ShareStep)
	t.Logf("B after its step: %+v", *xb.h.Load())
	stepView(A, s, "x:", ShareStep)
	if !xb.h.Load().ejected() || !xa.h.Load().ejected() {
		t.Errorf("B's fresh ejection undone: B ejected=%v, A ejected=%v (keys %v)",
			xb.h.Load().ejected(), xa.h.Load().ejected(), s.keys())
	}
}

// TestReviewFencedHolderKeepsProbing: the fence ("the holder stops acting
// on the lease after 0.9 of its TTL without a renewal") is only applied
// inside a step. A holder whose nginx thread does not step for a while
// (busy, blocked) keeps its prober running in Go while another view takes
// the lapsed lease: two probers.
func TestReviewFencedHolderKeepsProbing(t *testing.T) {
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	var views []*Pool
	for i := range 2 {
		p, _ := fakePool(t, 2)
		p.clk = clk
		p.cfg.Check = HealthCheck{Method: "probe", Interval: 100 * time.Millisecond, Timeout: 50 * time.Millisecond}
		p.Share(ShareConfig{Slot: i, Slots: 2})
		views = append(views, p)
	}
	stepView(views[0], s, "x:", ShareStep)
	stepView(views[1], s, "x:", ShareStep)
	if views[0].share.noProbe.Load() {
		t.Fatal("setup: view 0 does not hold the lease")
	}
	// view 0's worker does not step for 300 ms (3 periods; TTL 250 ms)
	for range 3 {
		clk.Advance(100 * time.Millisecond)
		stepView(views[1], s, "x:", ShareStep)
	}
	probers := 0
	for _, p := range views {
		if p.roleHeld(leaseProbe) { // what the prober asks each round
			probers++
		}
	}
	if probers != 1 {
		t.Errorf("%d views probe (the silent holder was never fenced)", probers)
	}
}

// TestReviewKeysPerServerGrow: the keys of a server do not grow with the
// runs of failures that end (a failure, then an answer): a run's end takes
// no new verdict generation, so a server that fails now and then does not
// fill the dict with c:<addr>:<g> and f:<addr>:<g> keys.
func TestReviewKeysPerServerGrow(t *testing.T) {
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	p, _ := fakePool(t, 2)
	p.clk = clk
	p.Share(ShareConfig{Slot: 0, Slots: 1})
	x := p.set.Load().peers[0]
	for range 100 {
		p.outcome(x, 0, errTimeoutForTest())
		stepView(p, s, "x:", ShareStep)
		p.outcome(x, 0, nil)
		stepView(p, s, "x:", ShareStep)
		clk.Advance(100 * time.Millisecond)
	}
	n := 0
	for _, k := range s.keys() {
		if strings.Contains(k, x.addr) {
			n++
		}
	}
	if n > 3 {
		t.Errorf("%d live keys for one server after 10 s of occasional failures (docs: up to 3)", n)
	}
}
