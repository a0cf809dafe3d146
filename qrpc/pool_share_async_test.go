package qrpc

import (
	"strings"
	"testing"
	"time"
)

// TestShareStepTransports: a step runs through one transport, the host's
// queue (ShareAsync) or a call on its thread; an exchange of the other
// kind that comes meanwhile (a round of a step the host dropped, still
// on its way) is refused and leaves the step be, which then ends as it
// would have: it takes the probe lease.
func TestShareStepTransports(t *testing.T) {
	for _, async := range []bool{true, false} {
		clk := newFakeClock()
		s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
		p, _ := fakePool(t, 2)
		p.clk = clk
		p.cfg.Check = HealthCheck{Method: "probe", Interval: time.Second, Timeout: 100 * time.Millisecond}
		p.Share(ShareConfig{Slot: 0, Slots: 1})
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
		lease := false
		for _, k := range s.keys() {
			lease = lease || strings.HasSuffix(k, ":lp")
		}
		if !lease {
			t.Fatalf("async %v: no probe lease in the store: %v", async, s.keys())
		}
	}
}
