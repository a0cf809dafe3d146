package qrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
)

// benchPool is a pool of n servers whose clients look connected, enough
// for pick (no network: only the choice is measured).
func benchPool(tb testing.TB, n int, b Balance) *Pool {
	tb.Helper()
	p := &Pool{cfg: PoolConfig{Balance: b, Failures: 3, Eject: time.Second, Stall: defaultStall, Observer: observe.Nop{}, EjectOn: failAll},
		log: slogDiscard(), clk: realClock{}}
	var peers []*peer
	for i := range n {
		pr := newPeer(p, "10.0.0."+strconv.Itoa(i+1)+":8443")
		sl := &slot{}
		sl.cur.Store(&qconn{})
		pr.c = &Client{slots: []*slot{sl}}
		peers = append(peers, pr)
	}
	p.set.Store(&peerSet{peers: peers, tiers: buildTiers(peers)})
	return p
}

// benchPick measures pick with 3 idle servers, or busy ones (calls in
// flight, answering: the stall check needs the time). A call's attempt
// lends pick the time it reads anyway (its start time), as done here,
// refreshed every 256 picks; an event's pick reads it (one time.Now).
func benchPick(b *testing.B, bal Balance, busy bool) {
	p := benchPool(b, 3, bal)
	if busy {
		for _, pr := range p.set.Load().peers {
			pr.startCall(time.Now())
		}
		// Answering all along: progress keeps up with the clock.
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case now := <-t.C:
					for _, pr := range p.set.Load().peers {
						pr.answered(now, 0)
					}
				}
			}
		}()
	}
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = []byte("user-" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		var now time.Time
		for pb.Next() {
			var clk pickClock
			if busy {
				if i&255 == 0 {
					now = time.Now()
				}
				clk.t = now
			}
			pr, _ := p.pick(keys[i&1023], nil, false, &clk)
			if pr == nil {
				b.Fatal("no server")
			}
			i++
		}
	})
}

func BenchmarkPoolPickRoundRobin(b *testing.B)        { benchPick(b, RoundRobin, false) }
func BenchmarkPoolPickLeastInflight(b *testing.B)     { benchPick(b, LeastInflight, false) }
func BenchmarkPoolPickHash(b *testing.B)              { benchPick(b, Hash, false) }
func BenchmarkPoolPickBusyRoundRobin(b *testing.B)    { benchPick(b, RoundRobin, true) }
func BenchmarkPoolPickBusyLeastInflight(b *testing.B) { benchPick(b, LeastInflight, true) }
func BenchmarkPoolPickBusyHash(b *testing.B)          { benchPick(b, Hash, true) }
func BenchmarkPoolPickP2C(b *testing.B)               { benchPick(b, P2C, false) }
func BenchmarkPoolPickBusyP2C(b *testing.B)           { benchPick(b, P2C, true) }

// TestPickSkipsEjected: an ejected server gets no call until its time is
// up, then exactly one (the trial) until that call's verdict.
func TestPickSkipsEjected(t *testing.T) {
	for _, bal := range []Balance{RoundRobin, LeastInflight, Hash, P2C} {
		p := benchPool(t, 3, bal)
		victim := p.set.Load().peers[1]
		setEjected(p, victim, monoNS(time.Now().Add(time.Hour)))
		for i := range 300 {
			pr, trial := p.pick([]byte("k"+strconv.Itoa(i)), nil, false, &pickClock{})
			if pr == victim || trial != 0 {
				t.Fatalf("%v: ejected server picked", bal)
			}
		}
		setEjected(p, victim, monoNS(time.Now().Add(-time.Millisecond)))
		trials := 0
		var token uint64
		for i := range 300 {
			if pr, trial := p.pick([]byte("k"+strconv.Itoa(i)), nil, false, &pickClock{}); pr == victim {
				if trial == 0 {
					t.Fatalf("%v: ejected server picked without a trial", bal)
				}
				token = trial
				trials++
			}
		}
		if trials != 1 {
			t.Fatalf("%v: %d trial calls, want 1", bal, trials)
		}
		p.outcome(victim, token, nil)
		if victim.h.Load().until != 0 {
			t.Fatalf("%v: a successful trial did not bring the server back", bal)
		}
	}
}

// TestEjectionDoubles: each failed trial doubles the ejection, up to 10×;
// the last server up is never ejected.
func TestEjectionDoubles(t *testing.T) {
	p := benchPool(t, 2, RoundRobin)
	p.log = slogDiscard()
	a, b := p.set.Load().peers[0], p.set.Load().peers[1]
	fail := errTimeoutForTest()
	for range 3 {
		p.outcome(a, 0, fail)
	}
	if a.h.Load().until == 0 {
		t.Fatal("not ejected after 3 failures")
	}
	want := time.Second
	for range 6 {
		want = min(2*want, 10*time.Second)
		p.outcome(a, trialOf(p, a), fail)
		if got := time.Duration(a.h.Load().ejectFor); got != want {
			t.Fatalf("ejection %v, want %v", got, want)
		}
	}
	for range 10 {
		p.outcome(b, 0, fail)
	}
	if b.h.Load().until != 0 {
		t.Fatal("the last server up was ejected")
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func errTimeoutForTest() error { return fmt.Errorf("%w: test", ErrTimeout) }

// TestRetryAttemptEnds: a retry whose only servers refuse the call at once
// (their connections are down) ends with an error instead of going round
// the same servers for ever.
func TestRetryAttemptEnds(t *testing.T) {
	for _, n := range []int{1, 3} {
		p := benchPool(t, n, RoundRobin)
		for _, pr := range p.set.Load().peers {
			clientOf(pr).slots[0].cur.Store(nil) // connection down: Start refuses
		}
		pc := &poolCall{pool: p, done: func(*Response, error) {}}
		done := make(chan error, 1)
		go func() {
			pc.mu.Lock()
			defer pc.mu.Unlock()
			done <- pc.attempt(&Call{Method: []byte("m")}, true, time.Now())
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%d servers: %v, want ErrUnavailable", n, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d servers: the retry never ended", n)
		}
	}
}

// answerFor makes the servers in others answer every 5 ms (on the clock
// of the times passed, from start) for d; it returns the end.
func answerFor(start time.Time, d time.Duration, others ...*peer) time.Time {
	at := start
	for at.Before(start.Add(d)) {
		at = at.Add(5 * time.Millisecond)
		for _, o := range others {
			o.answered(at, 0)
		}
	}
	return at
}

// TestPickSkipsStalled: a server with calls in flight and no answer while
// the others answered for Stall gets no new call while another server can
// take it; it gets them again once it answers; when every server is
// stalled, or there is only one, or Stall is off, calls still go out.
func TestPickSkipsStalled(t *testing.T) {
	picks := func(p *Pool) map[*peer]int {
		got := map[*peer]int{}
		for i := range 300 {
			pr, _ := p.pick([]byte("k"+strconv.Itoa(i)), nil, false, &pickClock{})
			got[pr]++
		}
		return got
	}
	for _, bal := range []Balance{RoundRobin, LeastInflight, Hash, P2C} {
		p := benchPool(t, 3, bal)
		peers := p.set.Load().peers
		now := time.Now()
		for _, pr := range peers {
			pr.startCall(now) // busy, all alike: least_inflight ties
		}
		victim := peers[1]
		// The others answer for a full limit: the silence is the victim's.
		now = answerFor(now, p.cfg.Stall+10*time.Millisecond, peers[0], peers[2])
		if !victim.info().Stalled || peers[0].info().Stalled {
			t.Fatalf("%v: stalled %v, %v", bal, victim.info().Stalled, peers[0].info().Stalled)
		}
		if got := picks(p); got[victim] != 0 || got[nil] != 0 {
			t.Fatalf("%v: the stalled server took %d of 300 calls (%d found none)", bal, got[victim], got[nil])
		}
		victim.answered(now, 0)
		if got := picks(p); got[victim] < 50 {
			t.Fatalf("%v: the server that answered again took %d of 300 calls", bal, got[victim])
		}
		// Every server stalled: the calls still go out, spread as usual.
		for _, pr := range peers {
			pr.progress.Store(p.active.Load() - int64(time.Second))
		}
		if got := picks(p); got[nil] != 0 || got[victim] < 50 {
			t.Fatalf("%v: every server stalled: %d calls found none, %d went to %s", bal, got[nil], got[victim], victim.addr)
		}
		// Off: a server is never stalled.
		p.cfg.Stall = -1
		if got := picks(p); got[victim] < 50 || victim.info().Stalled {
			t.Fatalf("%v: stall off: the silent server took %d of 300 calls", bal, got[victim])
		}
	}
	// One server: always picked, stalled or not.
	p := benchPool(t, 1, RoundRobin)
	only := p.set.Load().peers[0]
	only.startCall(time.Now())
	only.progress.Store(p.active.Load() - int64(time.Second))
	if !only.info().Stalled {
		t.Fatal("the lone server is not shown stalled")
	}
	if got := picks(p); got[only] != 300 {
		t.Fatalf("the lone stalled server took %d of 300 calls", got[only])
	}
	// An idle server is never stalled, however long it was idle.
	p = benchPool(t, 2, RoundRobin)
	idle := p.set.Load().peers[0]
	answerFor(time.Now(), time.Second, p.set.Load().peers[1])
	if idle.info().Stalled {
		t.Fatal("an idle server is stalled")
	}
}

// TestStalledVerdictHolds: once a server is seen stalled (here through
// Peers, as an operator or a test sees it), the very next picks skip it,
// whatever happens meanwhile (one of its calls times out, which raises its
// answer time and so its limit; a pool-wide silence, this process
// standing still), until it answers.
func TestStalledVerdictHolds(t *testing.T) {
	for _, bal := range []Balance{RoundRobin, LeastInflight, Hash, P2C} {
		p := benchPool(t, 3, bal)
		peers := p.set.Load().peers
		victim := peers[1]
		now := time.Now()
		for _, pr := range peers {
			pr.observeLatency(monoNS(now), 2*time.Millisecond) // fast: the limit is the floor
			pr.startCall(now)
		}
		now = answerFor(now, stallFloor+10*time.Millisecond, peers[0], peers[2])
		if !victim.info().Stalled {
			t.Fatalf("%v: not seen stalled", bal)
		}
		// A call of its times out: its answer time, and its limit, go up.
		victim.observeLatency(monoNS(now), time.Second)
		// Two seconds of silence from everyone (this process stood still),
		// then one server answers: the verdict still stands.
		now = now.Add(2 * time.Second)
		peers[0].answered(now, 0)
		for i := range 300 {
			if pr, _ := p.pick([]byte("k"+strconv.Itoa(i)), nil, false, &pickClock{t: now}); pr == victim {
				t.Fatalf("%v: pick %d after the verdict took the stalled server", bal, i)
			}
		}
		victim.answered(now, 0)
		if victim.info().Stalled {
			t.Fatalf("%v: still stalled after it answered", bal)
		}
	}
}

// TestStallLimit: Stall, shortened to 8 × the server's own peak-EWMA
// answer time when it answers fast, never under stallFloor.
func TestStallLimit(t *testing.T) {
	p := benchPool(t, 3, RoundRobin)
	pr := p.set.Load().peers[0]
	stall := int64(p.cfg.Stall)
	for _, tc := range []struct {
		ewma, want time.Duration
	}{
		{0, 200 * time.Millisecond}, // nothing answered yet
		{time.Millisecond, stallFloor},
		{10 * time.Millisecond, 80 * time.Millisecond},
		{time.Second, 200 * time.Millisecond},
	} {
		pr.ewma.Store(int64(tc.ewma))
		if got := time.Duration(pr.stallLimit(stall)); got != tc.want {
			t.Errorf("ewma %v: stall limit %v, want %v", tc.ewma, got, tc.want)
		}
	}
}

// TestPeakEWMA: a slower answer raises the estimate at once, faster ones
// bring it down over the 10 s time constant, and p2c's cost decays with
// the time since the last sample.
func TestPeakEWMA(t *testing.T) {
	p := benchPool(t, 2, P2C)
	pr := p.set.Load().peers[0]
	base := monoNS(time.Now())
	pr.observeLatency(base, 4*time.Millisecond)
	pr.observeLatency(base+1e6, 100*time.Millisecond)
	if got := time.Duration(pr.ewma.Load()); got != 100*time.Millisecond {
		t.Fatalf("after a 100 ms answer: %v", got)
	}
	// 10 s of 1 ms answers, one every 10 ms: about e^-1 of the peak left.
	now := base + 1e6
	for range 1000 {
		now += int64(10 * time.Millisecond)
		pr.observeLatency(now, time.Millisecond)
	}
	got := time.Duration(pr.ewma.Load())
	if got < 30*time.Millisecond || got > 45*time.Millisecond {
		t.Fatalf("after 10 s of 1 ms answers: %v, want about 37 ms", got)
	}
	c0 := pr.cost(now)
	if c1 := pr.cost(now + int64(10*time.Second)); c1 > c0/2 {
		t.Fatalf("cost %v 10 s later, was %v: no decay", c1, c0)
	}
	pr.inflight.Store(3)
	if c := pr.cost(now); c < 3.9*c0 || c > 4.1*c0 {
		t.Fatalf("cost with 3 in flight %v, want 4 × %v", c, c0)
	}
	pr.inflight.Store(0)
}

// TestP2CPrefersFastServer: of two servers, the one with the lower peak
// EWMA takes most calls; both take some (a draw of the slow one against
// itself is impossible, so the slow one only loses the draws it is in).
func TestP2CPrefersFastServer(t *testing.T) {
	p := benchPool(t, 3, P2C)
	peers := p.set.Load().peers
	now := monoNS(time.Now())
	peers[0].observeLatency(now, 50*time.Millisecond)
	peers[1].observeLatency(now, time.Millisecond)
	peers[2].observeLatency(now, time.Millisecond)
	got := map[*peer]int{}
	for range 3000 {
		pr, _ := p.pick(nil, nil, false, &pickClock{})
		got[pr]++
	}
	if got[nil] != 0 || got[peers[0]] != 0 {
		t.Fatalf("slow server took %d of 3000 calls (%d found none)", got[peers[0]], got[nil])
	}
	if got[peers[1]] < 1000 || got[peers[2]] < 1000 {
		t.Fatalf("fast servers took %d and %d of 3000", got[peers[1]], got[peers[2]])
	}
	// Calls in flight make a fast server dearer: 60 in flight × 1 ms is
	// above 50 ms × 1.
	peers[1].inflight.Store(60)
	peers[2].inflight.Store(60)
	clear(got)
	for range 3000 {
		pr, _ := p.pick(nil, nil, false, &pickClock{})
		got[pr]++
	}
	peers[1].inflight.Store(0)
	peers[2].inflight.Store(0)
	if got[peers[0]] < 1500 {
		t.Fatalf("the idle slow server took %d of 3000 while the fast ones had 60 in flight", got[peers[0]])
	}
}

// TestRetryBudget: retries stay within the reserve plus the ratio of the
// calls of the last 10 s.
func TestRetryBudget(t *testing.T) {
	b := newRetryBudget(0.2, 10)
	now := time.Unix(1_000_000, 0)
	n := 0
	for b.withdraw(now) {
		n++
		if n > 1000 {
			t.Fatal("no bound")
		}
	}
	if n != 100 {
		t.Fatalf("reserve: %d retries, want 100 (10/s × 10 s)", n)
	}
	for range 1000 {
		b.deposit(now)
	}
	n = 0
	for b.withdraw(now) {
		n++
	}
	if n != 200 {
		t.Fatalf("after 1000 calls: %d more retries, want 200", n)
	}
	// 10 s later the window has forgotten all of it.
	later := now.Add(11 * time.Second)
	n = 0
	for b.withdraw(later) {
		n++
	}
	if n != 100 {
		t.Fatalf("11 s later: %d retries, want the reserve's 100", n)
	}
	b.refund(later)
	if !b.withdraw(later) {
		t.Fatal("a refund gives no retry back")
	}
	if b.withdraw(later) {
		t.Fatal("more than the budget after a refund")
	}
}

// TestLatencyWarmUp: the estimate exists from the latencyMinSamples-th
// answer, whatever the servers' call counts (pools.md: "no copy until the
// pool has 20 answers"); from then on one answer in latencySampleEvery is
// added, weighing as many, so the buckets still count answers.
func TestLatencyWarmUp(t *testing.T) {
	var h latencyHist
	calls := uint64(1)
	for range latencyMinSamples - 1 {
		h.answer(5*time.Millisecond, calls)
		calls++
	}
	if h.p95() != 0 {
		t.Fatalf("an estimate after %d answers", latencyMinSamples-1)
	}
	h.answer(5*time.Millisecond, calls)
	calls++
	if got := h.p95(); got < 5*time.Millisecond || got > 6250*time.Microsecond {
		t.Fatalf("after %d answers of 5 ms: p95 %v", latencyMinSamples, got)
	}
	n := h.n.Load()
	for range 400 {
		h.answer(5*time.Millisecond, calls)
		calls++
	}
	if added := h.n.Load() - n; added != 400/latencySampleEvery {
		t.Fatalf("warm: %d of 400 answers added, want one in %d", added, latencySampleEvery)
	}
	total := uint32(0)
	for i := range h.buckets {
		total += h.buckets[i].Load()
	}
	if total != latencyMinSamples+400 {
		t.Fatalf("buckets count %d answers, want %d", total, latencyMinSamples+400)
	}
}

// TestLatencyP95: the estimate is within one bucket (25 %) above the true
// 95th percentile, and none is given before latencyMinSamples answers.
func TestLatencyP95(t *testing.T) {
	var h latencyHist
	for range latencyMinSamples - 1 {
		h.add(time.Millisecond, 1)
	}
	if h.p95() != 0 {
		t.Fatal("an estimate from too few samples")
	}
	var h2 latencyHist
	for i := range 1000 {
		d := time.Millisecond
		if i%100 >= 94 { // 6 % slow
			d = 200 * time.Millisecond
		}
		h2.add(d, 1)
	}
	if got := h2.p95(); got < 200*time.Millisecond || got > 250*time.Millisecond {
		t.Fatalf("p95 %v with 6 %% at 200 ms", got)
	}
	var h3 latencyHist
	for range 1000 {
		h3.add(3*time.Millisecond, 1)
	}
	if got := h3.p95(); got < 3*time.Millisecond || got > 3750*time.Microsecond {
		t.Fatalf("p95 %v of 3 ms answers", got)
	}
}

// TestNoStallAfterPoolSilence: a server's silence is counted in the time
// the pool went on getting answers: when no server of the pool answers
// for a while (the machine or this process stood still), that pause
// counts for at most activeGapCap, and a server still silent after it is
// stalled only once the others have answered for its limit since.
func TestNoStallAfterPoolSilence(t *testing.T) {
	p := benchPool(t, 3, RoundRobin)
	peers := p.set.Load().peers
	start := time.Now()
	for _, pr := range peers {
		pr.startCall(start)
		pr.answered(start, 0)
	}
	// Two seconds of silence from everyone, then one server answers.
	now := start.Add(2 * time.Second)
	peers[0].answered(now, 0)
	victim := peers[1]
	if got := time.Duration(p.active.Load() - victim.progress.Load()); got != activeGapCap {
		t.Fatalf("a 2 s pause counted for %v of silence, want %v", got, activeGapCap)
	}
	if victim.stalled(victim.inflight.Load(), &pickClock{t: now}, int64(p.cfg.Stall)) {
		t.Fatal("stalled at once after a pool-wide silence")
	}
	// The others answer all along (every 5 ms) until just under the limit,
	// then past it.
	limit := time.Duration(victim.stallLimit(int64(p.cfg.Stall)))
	now = answerFor(now, limit-activeGapCap-5*time.Millisecond, peers[0])
	if victim.stalled(victim.inflight.Load(), &pickClock{t: now}, int64(p.cfg.Stall)) {
		t.Fatalf("stalled after %v of the others' answers, under its %v limit", time.Duration(p.active.Load()-victim.progress.Load()), limit)
	}
	now = answerFor(now, 10*time.Millisecond, peers[0])
	if !victim.stalled(victim.inflight.Load(), &pickClock{t: now}, int64(p.cfg.Stall)) {
		t.Fatal("still silent a full limit after the others came back, yet not stalled")
	}
}

// TestExcludeForgetsNone: a call that has tried more servers than the
// inline few still keeps every one out of its next pick (a ring that
// forgot the first would send the call round the servers for ever).
func TestExcludeForgetsNone(t *testing.T) {
	p := benchPool(t, 12, RoundRobin)
	var ex exclude
	for i := range 12 {
		pr, _ := p.pick(nil, &ex, false, &pickClock{})
		if pr == nil {
			t.Fatalf("pick %d: none, with %d of 12 tried", i, i)
		}
		if ex.has(pr) {
			t.Fatalf("pick %d: %s again", i, pr.addr)
		}
		ex.add(pr)
	}
	if pr, _ := p.pick(nil, &ex, false, &pickClock{}); pr != nil {
		t.Fatalf("every server tried, yet %s picked", pr.addr)
	}
}

// TestResolvedServerNames: addresses resolved from two names on one port
// are each verified against their own name.
func TestResolvedServerNames(t *testing.T) {
	p := benchPool(t, 1, RoundRobin)
	targets := []target{{host: "a.svc", port: "7000"}, {host: "b.svc", port: "7000"}, {host: "127.0.0.9", port: "7000", literal: true}}
	dns := map[string][]netip.Addr{
		"a.svc": {netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")},
		"b.svc": {netip.MustParseAddr("10.0.1.1")},
	}
	want, names, err := resolveTargets(t.Context(), targets, time.Second, func(_ context.Context, h string) ([]netip.Addr, error) {
		return dns[h], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 4 {
		t.Fatalf("addresses %v", want)
	}
	for addr, name := range map[string]string{"10.0.0.1:7000": "a.svc", "10.0.0.2:7000": "a.svc", "10.0.1.1:7000": "b.svc", "127.0.0.9:7000": "127.0.0.9"} {
		if got := p.peerConf(addr, names).ServerName; got != name {
			t.Errorf("%s: server name %q, want %q", addr, got, name)
		}
	}
}

// TestStallWithEveryCallOnIt: when every call in flight is on the silent
// server (clients caught on it wait and ask no other server, so no other
// answer moves the pool's answer clock), the monotonic clock judges: it is
// stalled once its limit has passed since its last sign of life, provided
// another server answered after that sign (else the silence may be this
// process's own).
func TestStallWithEveryCallOnIt(t *testing.T) {
	p := benchPool(t, 3, RoundRobin)
	peers := p.set.Load().peers
	victim := peers[1]
	start := time.Now()
	victim.startCall(start)
	victim.startCall(start)
	limit := time.Duration(victim.stallLimit(int64(p.cfg.Stall)))
	at := func(d time.Duration) bool {
		return victim.stalled(victim.inflight.Load(), &pickClock{t: start.Add(d)}, int64(p.cfg.Stall))
	}
	if at(limit + time.Millisecond) {
		t.Fatal("stalled with no other server's answer since its calls began")
	}
	peers[0].startCall(start.Add(2 * time.Millisecond))
	peers[0].answered(start.Add(3*time.Millisecond), 0)
	peers[0].endCall()
	if at(limit) {
		t.Fatal("stalled at its limit, not past it")
	}
	if !at(limit + time.Millisecond) {
		t.Fatal("not stalled past its limit with every call on it")
	}
	// Another server with a call in flight: its answers judge instead.
	victim.stallSeen.Store(false)
	peers[2].startCall(start)
	if at(limit + time.Millisecond) {
		t.Fatal("stalled by the monotonic clock while another server has calls to answer")
	}
}

// setEjected sets pr's ejection end (monoNS), as a transition would.
func setEjected(p *Pool, pr *peer, until int64) {
	p.hmu.Lock()
	h := *pr.h.Load()
	h.until = until
	pr.h.Store(&h)
	p.hmu.Unlock()
}

// trialOf ends pr's ejection now and claims its trial.
func trialOf(p *Pool, pr *peer) uint64 {
	setEjected(p, pr, monoNS(p.clk.Now()))
	return p.claim(pr, &pickClock{src: p.clk})
}

// clientOf is pr's client (a pool of real servers).
func clientOf(pr *peer) *Client { return pr.c.(*Client) }
