package qrpc

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// TestShareLateQueuedFirstRound: a step Go asked for is queued with the
// results of the first round the last step's answer gave (its pre), and
// reaches Go more than 1 s later (the submitter starved of CPU): the Lua
// side has taken it as lost, and a step on the nginx thread (a call's)
// ran meanwhile, ended and handed out a new first round. The late record
// carries results of the old round's ops, read before that step; taken
// as the results of the new round, they put the view back to what the
// store held then: here a lease of another view that has since gone, so
// the view stops probing although the store names it the holder, and no
// view probes until that lease ends (75 s with check = 2000, steps every
// 0.5 s meanwhile).
func TestShareLateQueuedFirstRound(t *testing.T) {
	p, s, clk := probingView(t, time.Second)
	// step runs a whole step on the nginx thread; it returns the first
	// round of the next one (ShareNext, as the last answer carries it).
	step := func(first []StoreResult) []StoreOp {
		ops, more := p.ShareStep(ShareStep, first)
		for rounds := 1; more; rounds++ {
			if rounds > 8 {
				t.Fatal("a step of more than 8 rounds")
			}
			ops, more = p.ShareStep(0, s.run("x:", ops))
		}
		s.run("x:", ops)
		return p.ShareNext()
	}
	// another view (of a live process: this one) holds the probe lease
	other := strconv.Itoa(os.Getpid()) + "-other"
	ttl := 30 * time.Second
	s.run("x:", []StoreOp{{Kind: OpSet, Key: "lp" + p.listScope(), Value: leaseValue(other, p.hostNS(clk.Now())+int64(ttl)), TTL: ttl}})
	pre := step(nil)
	if pre == nil || !p.share.noProbe.Load() {
		t.Fatalf("setup: pre %v, probes %v", pre != nil, !p.share.noProbe.Load())
	}
	// Go asks; the step is queued with its first round's results (the
	// other view's lease), and waits in the submit queue.
	late := s.run("x:", pre)
	// the other view goes (its exit deletes the lease); 1 s later a call
	// steps on the nginx thread (the queued step taken as lost: no pre)
	s.run("x:", []StoreOp{{Kind: OpDelete, Key: "lp" + p.listScope()}, {Kind: OpIncr, Key: "v", Delta: 1}})
	clk.Advance(1100 * time.Millisecond)
	if step(nil) == nil {
		t.Fatal("setup: no first round handed out")
	}
	if p.share.noProbe.Load() {
		t.Fatalf("setup: the free lease not taken (store %v)", s.keys())
	}
	// the queued step reaches Go (its answer the Lua side drops)
	p.ShareStep(ShareStep|ShareAsync, late)
	if p.share.noProbe.Load() {
		t.Fatalf("a queued step's late first round, read before the last step, was taken as the "+
			"results of that step's round: the view stopped probing, the store names it (store %v)",
			s.keys())
	}
	// A queued step that Go asked for and that comes before any other
	// still begins with the results it carries: an idle step is one
	// exchange (its answer ends it).
	pre = step(nil)
	p.share.notified.Store(true) // Go asked
	if _, more := p.ShareStep(ShareStep|ShareAsync, s.run("x:", pre)); more {
		t.Fatal("a queued idle step with its first round's results took more than one exchange")
	}
}

// TestShareLateQueuedStepNoCut: a late queued step (as above) reaches Go
// while a step on the nginx thread is between its rounds: that step,
// begun after the queued one's ask, serves it; cut there (after its add
// of the free lease, before the round that takes the add's result), it
// would leave the lease naming this view while the view does not hold
// it: no view probes until the lease ends (75 s with check = 2000).
func TestShareLateQueuedStepNoCut(t *testing.T) {
	p, s, _ := probingView(t, 2*time.Second)
	ops, more := p.ShareStep(ShareStep, nil)
	cut := false
	for rounds := 1; more; rounds++ {
		if rounds > 8 {
			t.Fatal("a step of more than 8 rounds")
		}
		res := s.run("x:", ops)
		for _, o := range ops {
			if o.Kind == OpAdd && o.Key == "lp"+p.listScope() && !cut {
				cut = true
				if o, m := p.ShareStep(ShareStep|ShareAsync, nil); o != nil || m {
					t.Errorf("the late queued step began: %d ops, more %v", len(o), m)
				}
			}
		}
		ops, more = p.ShareStep(0, res)
	}
	s.run("x:", ops)
	if !cut {
		t.Fatalf("setup: the step added no probe lease (store %v)", s.keys())
	}
	if p.share.noProbe.Load() {
		t.Fatalf("the late queued step cut the step after its lease add: the store names this view "+
			"(store %v), the view does not probe", s.keys())
	}
}
