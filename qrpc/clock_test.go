package qrpc

import (
	"fmt"
	"math"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// fakeClock is a pool's clock in a test: time moves only by Advance, and
// timers fire then, in order, on the caller's goroutine.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *fakeClock
	at   time.Time
	d    time.Duration
	f    func()
	live bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), d: d, f: f, live: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.live
	t.live = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.live
	t.at, t.d, t.live = t.c.now.Add(d), d, true
	return was
}

// armed returns the delays of the live timers, in order.
func (c *fakeClock) armed() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Duration
	for _, t := range c.timers {
		if t.live {
			out = append(out, t.d)
		}
	}
	return out
}

// Advance moves time on by d, firing the timers due on the way.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		var due []*fakeTimer
		for _, t := range c.timers {
			if t.live && !t.at.After(end) {
				due = append(due, t)
			}
		}
		if len(due) == 0 {
			break
		}
		sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
		t := due[0]
		t.live = false
		c.now = t.at
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

func fakePool(t *testing.T, n int) (*Pool, *fakeClock) {
	p := benchPool(t, n, RoundRobin)
	clk := newFakeClock()
	p.clk = clk
	p.budget = newRetryBudget(defaultRetryRatio, defaultRetryMinPerS)
	return p, clk
}

// TestEjectionWindowFakeClock: an ejection lasts exactly Eject on the
// pool's clock; a failed trial doubles it, up to 10×; a success ends it.
func TestEjectionWindowFakeClock(t *testing.T) {
	p, clk := fakePool(t, 2)
	a := p.set.Load().peers[0]
	for range p.cfg.Failures {
		p.outcome(a, 0, errTimeoutForTest())
	}
	eligibleAt := func(d time.Duration) (bool, bool) {
		c := pickClock{t: clk.Now().Add(d), src: clk}
		k := p.admit(a, nil, &c)
		return k != admitNo, k == admitTrial
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second} {
		if ok, _ := eligibleAt(want - time.Nanosecond); ok {
			t.Fatalf("ejection %d: eligible 1 ns before its %v", i, want)
		}
		if ok, trial := eligibleAt(want); !ok || !trial {
			t.Fatalf("ejection %d: not up for a trial after its %v (%v, %v)", i, want, ok, trial)
		}
		if until := wallAt(a.h.Load().until, clk.Now()); !until.Equal(clk.Now().Add(want).Round(0)) {
			t.Fatalf("ejection %d: until %v, want %v", i, until, clk.Now().Add(want))
		}
		clk.Advance(want)
		pr, trial := p.pick(nil, &exclude{peers: [8]*peer{p.set.Load().peers[1]}, n: 1}, false, &pickClock{src: clk})
		if pr != a || trial == 0 {
			t.Fatalf("ejection %d: its end gave no trial (%v, %v)", i, pr, trial)
		}
		p.outcome(a, trial, errTimeoutForTest()) // the trial fails: again, longer
	}
	clk.Advance(10 * time.Second)
	pr, trial := p.pick(nil, &exclude{peers: [8]*peer{p.set.Load().peers[1]}, n: 1}, false, &pickClock{src: clk})
	if pr != a || trial == 0 {
		t.Fatal("no trial after the last ejection")
	}
	p.outcome(a, trial, nil)
	if h := a.h.Load(); h.until != 0 || time.Duration(h.ejectFor) != p.cfg.Eject {
		t.Fatalf("after a good trial: ejected until %d, next ejection %v", h.until, time.Duration(h.ejectFor))
	}
}

// TestRetryBudgetFakeClock: withdrawals stay within minPerS × 10 + ratio
// × the calls of the last 10 s, slot by slot.
func TestRetryBudgetFakeClock(t *testing.T) {
	clk := newFakeClock()
	b := newRetryBudget(0.2, 1) // a reserve of 10
	withdrawAll := func() int {
		n := 0
		for b.withdraw(clk.Now()) {
			n++
			if n > 1000 {
				t.Fatal("the budget never runs out")
			}
		}
		return n
	}
	for range 100 {
		b.deposit(clk.Now())
	}
	if n := withdrawAll(); n != 30 {
		t.Fatalf("100 calls: %d retries, want 10 + 20", n)
	}
	b.refund(clk.Now())
	if n := withdrawAll(); n != 1 {
		t.Fatalf("after a refund: %d retries, want 1", n)
	}
	// 5 s on, 50 more calls: the first 100 still count.
	clk.Advance(5 * time.Second)
	for range 50 {
		b.deposit(clk.Now())
	}
	if n := withdrawAll(); n != 10 {
		t.Fatalf("150 calls, 30 spent: %d retries, want 10", n)
	}
	// 10 s after the first calls, they and their retries are forgotten:
	// 50 calls and 10 spent remain.
	clk.Advance(5 * time.Second)
	if n := withdrawAll(); n != 10+10-10 {
		t.Fatalf("50 calls, 10 spent: %d retries, want 10", n)
	}
	// 10 s of nothing: the reserve alone.
	clk.Advance(10 * time.Second)
	if n := withdrawAll(); n != 10 {
		t.Fatalf("no calls: %d retries, want the reserve of 10", n)
	}
}

// TestEWMADecayFakeClock: a sample above the peak EWMA replaces it; one
// below pulls it down with a 10 s time constant; cost decays the same way.
func TestEWMADecayFakeClock(t *testing.T) {
	p, clk := fakePool(t, 1)
	pr := p.set.Load().peers[0]
	t0 := monoNS(clk.Now())
	pr.observeLatency(t0, 100*time.Millisecond)
	pr.observeLatency(t0+1, 200*time.Millisecond) // a peak replaces it
	if got := pr.ewma.Load(); got != int64(200*time.Millisecond) {
		t.Fatalf("after a peak: %v", time.Duration(got))
	}
	clk.Advance(ewmaDecay)
	t1 := monoNS(clk.Now())
	if got, want := pr.cost(t1), 200e6*math.Exp(-float64(t1-t0-1)/float64(ewmaDecay)); math.Abs(got-want) > 1 {
		t.Fatalf("cost after τ idle: %v, want %v", got, want)
	}
	pr.observeLatency(t1, 10*time.Millisecond)
	w := math.Exp(-float64(t1-t0-1) / float64(ewmaDecay))
	if got, want := float64(pr.ewma.Load()), 200e6*w+10e6*(1-w); math.Abs(got-want) > 1 {
		t.Fatalf("after τ: %v, want %v", time.Duration(got), time.Duration(want))
	}
	// Busy gaps use the linear form: within 5e-7 of e^(-x).
	for _, dt := range []int64{1, 1000, int64(time.Millisecond), int64(ewmaDecay) / 1000} {
		if got, want := decay(dt), math.Exp(-float64(dt)/float64(ewmaDecay)); math.Abs(got-want) > 5e-7 {
			t.Fatalf("decay(%d) = %v, want %v", dt, got, want)
		}
	}
}

// TestHedgeDelayFakeClock: a copy is armed after Delay, or after the
// measured p95 (at least 1 ms), and not at all before the p95 is known.
func TestHedgeDelayFakeClock(t *testing.T) {
	p, clk := fakePool(t, 2)
	pc := &poolCall{pool: p}
	pc.armHedge(Hedge{Delay: 30 * time.Millisecond, Max: 1})
	if got := clk.armed(); len(got) != 1 || got[0] != 30*time.Millisecond {
		t.Fatalf("armed %v, want [30ms]", got)
	}
	// It fires at 30 ms exactly; with no attempt live it sends nothing.
	clk.Advance(30*time.Millisecond - time.Nanosecond)
	if len(clk.armed()) != 1 {
		t.Fatal("fired early")
	}
	clk.Advance(time.Nanosecond)
	if len(clk.armed()) != 0 || pc.hedges != 1 {
		t.Fatalf("after 30 ms: armed %v, %d copies left", clk.armed(), pc.hedges)
	}
	pc2 := &poolCall{pool: p}
	pc2.armHedge(Hedge{P95: true, Max: 1})
	if len(clk.armed()) != 0 {
		t.Fatal("armed on a p95 not measured yet")
	}
	for range latencyMinSamples {
		p.lat.add(3*time.Millisecond, 1)
	}
	pc2.armHedge(Hedge{P95: true, Max: 1})
	if got, want := clk.armed(), latencyUpper(latencyBucket(3*time.Millisecond)); len(got) != 1 || got[0] != want {
		t.Fatalf("p95 copy armed %v, want [%v]", got, want)
	}
}

// TestBackoffJitterExact: the schedule's bounds, exactly.
func TestBackoffJitterExact(t *testing.T) {
	const base, maxDelay = time.Second, 120 * time.Second
	for _, tc := range []struct {
		n      int
		jitter float64
		want   time.Duration
	}{
		{0, 0, time.Second}, {0, -1, 800 * time.Millisecond}, {0, 1, 1200 * time.Millisecond},
		{1, 0, 1600 * time.Millisecond}, {2, 0, 2560 * time.Millisecond},
		{11, 0, maxDelay}, {11, 1, 144 * time.Second}, {math.MaxInt32, -1, 96 * time.Second},
	} {
		got := backoffJittered(base, maxDelay, tc.n, tc.jitter)
		if d := got - tc.want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("n=%d jitter=%v: %v, want %v", tc.n, tc.jitter, got, tc.want)
		}
	}
}

// TestRedialBackoffFakeClock: a client whose dials all fail (a closed
// loopback port) waits base × 1.6^n, capped, with its jitter, before each
// re-dial: exactly, on its own fake clock.
func TestRedialBackoffFakeClock(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	_ = pc.Close() // closed: every dial fails
	conf, err := (&Config{BackoffBase: time.Second, BackoffMax: 5 * time.Second, DialTimeout: 300 * time.Millisecond,
		CloseLinger: -1, Logger: slogDiscard()}).populate()
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialBackground(addr, conf, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	c.clk = clk
	c.jitter = func() float64 { return 0.5 } // +10 %
	c.startSlots()
	defer func() { _ = c.Close() }()
	for n, want := range []time.Duration{1100 * time.Millisecond, 1760 * time.Millisecond, 2816 * time.Millisecond,
		4505600 * time.Microsecond, 5500 * time.Millisecond, 5500 * time.Millisecond} {
		// The dial fails in real time (the port is closed); the wait
		// before the next one is armed on the fake clock.
		var armed []time.Duration
		testwait.Until(t, fmt.Sprintf("re-dial %d: a backoff armed after a failed dial", n), 10*time.Second, func() bool {
			armed = clk.armed()
			return len(armed) > 0
		})
		if len(armed) != 1 || armed[0]-want > time.Microsecond || want-armed[0] > time.Microsecond {
			t.Fatalf("re-dial %d: waits %v, want %v", n, armed, want)
		}
		clk.Advance(armed[0])
	}
	if c.lastDialErr() == nil {
		t.Fatal("no dial error recorded")
	}
}
