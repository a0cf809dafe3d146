package qrpc

import (
	"strings"
	"testing"
	"time"
)

// probingView is a shared pool, the only view of its store, with a probe
// check every interval.
func probingView(t *testing.T, interval time.Duration) (*Pool, *memStore, *fakeClock) {
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	p, _ := fakePool(t, 2)
	p.clk = clk
	p.cfg.Check = HealthCheck{Method: "probe", Interval: interval, Timeout: 100 * time.Millisecond}
	p.Share(ShareConfig{Slot: 0, Slots: 1})
	return p, s, clk
}

// lease reports whether the store holds a probe lease.
func (s *memStore) lease() bool {
	for _, k := range s.keys() {
		if _, rest, ok := strings.Cut(k, ":lp@"); ok && !strings.Contains(rest, ":") {
			return true
		}
	}
	return false
}

// TestShareStepTransports: a step runs through one transport, the host's
// queue (ShareAsync) or a call on its thread; an exchange of the other
// kind that comes meanwhile (a round of a step the host dropped, still
// on its way) is refused and leaves the step be, which then ends as it
// would have: it takes the probe lease.
func TestShareStepTransports(t *testing.T) {
	for _, async := range []bool{true, false} {
		p, s, _ := probingView(t, time.Second)
		via, other := 0, ShareAsync
		if async {
			via, other = ShareAsync, 0
		}
		ops, more := p.ShareStep(ShareStep|via, nil)
		for rounds := 1; more; rounds++ {
			if rounds > 8 {
				t.Fatalf("async %v: a step of more than 8 rounds", async)
			}
			res := s.run("x:", ops)
			// The other transport's round, with results of the same
			// length (those it would apply by position).
			if o, m := p.ShareStep(other, res); o != nil || m {
				t.Fatalf("async %v: the other transport's round was taken: %d ops, more %v", async, len(o), m)
			}
			ops, more = p.ShareStep(via, res)
		}
		s.run("x:", ops)
		if p.share.noProbe.Load() {
			t.Fatalf("async %v: the step did not take the probe lease", async)
		}
		if !s.lease() {
			t.Fatalf("async %v: no probe lease in the store: %v", async, s.keys())
		}
	}
}

// TestShareExitNotCutByQueuedStep: a pool closes (or its worker exits)
// while a step Go asked for is queued: the exit step runs on the nginx
// thread, and the queued step's first round reaches Go between the exit's
// two rounds (the submitter runs on another CPU). The exit still gives
// the lease up: a view that exits takes no queued step.
func TestShareExitNotCutByQueuedStep(t *testing.T) {
	p, s, _ := probingView(t, time.Second)
	lease := s.lease
	// a step through the queue takes the lease
	ops, more := p.ShareStep(ShareStep|ShareAsync, nil)
	for rounds := 1; more; rounds++ {
		if rounds > 8 {
			t.Fatal("a step of more than 8 rounds")
		}
		ops, more = p.ShareStep(ShareAsync, s.run("x:", ops))
	}
	s.run("x:", ops)
	if !lease() {
		t.Fatalf("no probe lease in the store: %v", s.keys())
	}
	// the exit, with the queued step's first round between its rounds
	ops, more = p.ShareStep(ShareExit, nil)
	res := s.run("x:", ops)
	p.ShareStep(ShareStep|ShareAsync, nil)
	for rounds := 1; more; rounds++ {
		if rounds > 8 {
			t.Fatal("an exit of more than 8 rounds")
		}
		ops, more = p.ShareStep(0, res)
		res = s.run("x:", ops)
	}
	if lease() {
		t.Fatalf("the exit kept the probe lease: %v", s.keys())
	}
	// A queued step that comes after the exit has ended (no step of the
	// nginx thread in progress then) is refused too: begun, it would read
	// the leases again for a view that has gone.
	if ops, more := p.ShareStep(ShareStep|ShareAsync, nil); ops != nil || more {
		t.Fatalf("a queued step after the exit began: %d ops, more %v", len(ops), more)
	}
}
