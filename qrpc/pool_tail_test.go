package qrpc_test

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// healthyLatency measures the p99 of calls to a healthy pool on this
// machine now: the unit of the timing bounds below.
func healthyLatency(t *testing.T, p *qrpc.Pool, method string, workers, n int) time.Duration {
	t.Helper()
	lat := runCalls(t, workers, n, func() error {
		_, err := poolCall(p, 5*time.Second, method, "")
		return err
	})
	return percentile(lat, 0.99)
}

// runCallsErrs makes n calls from workers goroutines and returns their
// latencies and errors.
func runCallsErrs(workers, n int, call func() error) ([]time.Duration, []error) {
	var mu sync.Mutex
	var lat []time.Duration
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / workers {
				began := time.Now()
				err := call()
				d := time.Since(began)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lat, errs
}

// runCalls makes n calls from workers goroutines; every call must succeed.
func runCalls(t *testing.T, workers, n int, call func() error) []time.Duration {
	t.Helper()
	lat, errs := runCallsErrs(workers, n, call)
	if len(errs) > 0 {
		t.Fatalf("%d of %d calls failed, first: %v", len(errs), n, errs[0])
	}
	return lat
}

// slowDial gives the dials of these tests the time a loaded machine may
// need: what they measure starts once the pool is up.
var slowDial = qrpc.Config{DialTimeout: 10 * time.Second}

func percentile(d []time.Duration, q float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// TestPoolTryTimeout: with one of three servers frozen, a try timeout and
// one retry, no call fails: an attempt caught on the frozen server ends at
// the try timeout and the call is answered by another server, long before
// its own timeout. The retries are counted on the frozen server.
func TestPoolTryTimeout(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(3)
	rec := newRecorder()
	// The same load on the healthy servers first, through a pool with no
	// try timeout: how long an answer takes on this machine now (the
	// race detector, other work) sets the try timeout, which the retry
	// on a healthy server must also meet, and the calls' deadline, so
	// that a miss below says the retry failed, not that the machine is
	// slow.
	cp := f.dial(t, addrs, &qrpc.PoolConfig{Config: slowDial, Stall: -1, Failures: 1 << 20})
	unit := healthyLatency(t, cp, "who", 10, 300)
	cal, calErrs := runCallsErrs(50, 500, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cp.Do(ctx, &qrpc.Call{Method: []byte("who")})
		return err
	})
	if len(calErrs) > 0 {
		t.Fatalf("%d of 500 calls failed before the freeze, first: %v", len(calErrs), calErrs[0])
	}
	slow := percentile(cal, 0.999)
	try := max(150*time.Millisecond, 4*slow)
	callTimeout := max(time.Second, try+4*slow)
	p := f.dial(t, addrs, &qrpc.PoolConfig{Config: slowDial, TryTimeout: try, Retries: 1, Observer: rec,
		Stall: -1, Failures: 1 << 20, RetryMinPerS: 1000})
	if _, err := poolCall(p, 10*time.Second, "who", ""); err != nil {
		t.Fatal(err)
	}
	f.srvs[1].freeze()
	pz := testsrv.ProbePauses()
	lat, errs := runCallsErrs(50, 1500, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_, err := p.Do(ctx, &qrpc.Call{Method: []byte("who")})
		return err
	})
	pause := pz.End()
	if len(errs) > 0 {
		// Each attempt has four times the slowest healthy answer measured
		// under the same load: only a machine that stood still for a good
		// part of a try explains a miss, and then for a few calls (the
		// load rose during the run). Without the retry a third of the
		// calls would fail.
		if pause < try/2 || len(errs) > 1500/100 {
			t.Fatalf("%d of 1500 calls failed within %v (try timeout %v, longest pause %v), first: %v", len(errs), callTimeout, try, pause, errs[0])
		}
		t.Logf("%d of 1500 calls failed, the machine stood still for %v", len(errs), pause)
	}
	frozen := rec.get(f.srvs[1].addr)
	if frozen.retried.Load() == 0 {
		t.Fatal("no call was retried off the frozen server")
	}
	if got, failed := frozen.retried.Load(), frozen.failed.Load(); got != failed {
		t.Fatalf("%d retries counted for %d attempts that timed out on the frozen server", got, failed)
	}
	t.Logf("healthy p99 %v, longest pause %v; with a frozen server: p50 %v p99 %v max %v; %d retries",
		unit, pause, percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1), frozen.retried.Load())
	if worst, bound := percentile(lat, 1), try+3*unit+2*pause+20*time.Millisecond; worst > bound {
		t.Fatalf("slowest call %v, want <= try timeout + a healthy answer + pauses (%v)", worst, bound)
	}

	// Every server frozen: each attempt ends at the try timeout and the
	// error says how many there were.
	f.srvs[0].freeze()
	f.srvs[2].freeze()
	ctx, cancel := context.WithTimeout(context.Background(), max(time.Second, 3*try))
	defer cancel()
	_, err := p.Do(ctx, &qrpc.Call{Method: []byte("who")})
	if !errors.Is(err, qrpc.ErrTimeout) || !strings.HasSuffix(err.Error(), "(2 attempts)") {
		t.Fatalf("all frozen: %v, want a timeout after 2 attempts", err)
	}
	var ae *qrpc.AttemptsError
	if !errors.As(err, &ae) || ae.Attempts != 2 {
		t.Fatalf("all frozen: %#v", err)
	}
	if !slices.Contains(addrs, ae.Server) {
		t.Fatalf("all frozen: last attempt on %q, want one of the servers %v", ae.Server, addrs)
	}
}

// TestPoolHedge: one server of three answers after 200 ms; with a hedge
// after 20 ms, calls are answered by a copy instead, and only the calls
// that meet the slow server send one.
func TestPoolHedge(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(3)
	rec := newRecorder()
	p := f.dial(t, addrs, &qrpc.PoolConfig{Config: slowDial, Observer: rec, Stall: -1, Failures: 1 << 20,
		RetryMinPerS: 1000})
	const delay = 20 * time.Millisecond
	healthy := runCalls(t, 20, 600, func() error {
		_, err := poolCall(p, 5*time.Second, "work", "")
		return err
	})
	unit := percentile(healthy, 0.99)
	// Healthy calls slower than the delay (a loaded machine) are hedged
	// too: that share is allowed on top of the 40 %.
	over := 0
	for _, d := range healthy {
		if d > delay {
			over++
		}
	}
	f.srvs[0].delay.Store(200)
	const calls = 2000
	pz := testsrv.ProbePauses()
	lat := runCalls(t, 20, calls, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := p.Do(ctx, &qrpc.Call{Method: []byte("work"), Hedge: qrpc.Hedge{Delay: delay, Max: 1}})
		return err
	})
	hedged := int64(0)
	for _, a := range addrs {
		hedged += rec.get(a).hedged.Load()
	}
	pause := pz.End()
	p99 := percentile(lat, 0.99)
	t.Logf("healthy p99 %v, longest pause %v; one slow server, hedged at %v: p50 %v p99 %v; %d copies for %d calls",
		unit, pause, delay, percentile(lat, 0.5), p99, hedged, calls)
	if bound := delay + 3*unit + 2*pause + 20*time.Millisecond; p99 > bound {
		t.Fatalf("p99 %v, want <= hedge delay + a healthy answer (%v)", p99, bound)
	}
	if allowed := int64(calls*4/10 + calls*over/len(healthy)); hedged > allowed {
		t.Fatalf("%d copies for %d calls, want <= 40 %% + the %d of %d healthy calls over the delay (%d)",
			hedged, calls, over, len(healthy), allowed)
	}
	if rec.get(addrs[0]).hedged.Load() == 0 {
		t.Fatal("the slow server's calls were never hedged")
	}
}

// TestPoolHedgeLosersNotCounted: every server answers in 20 ms and every
// call sends a copy after 1 ms; the copy that lost is cancelled, which is
// no call result for the observer (metrics.md: a cancelled attempt is not
// in qrpc_client_calls_total), while each copy sent is reported Hedged.
func TestPoolHedgeLosersNotCounted(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(3)
	for _, m := range f.srvs {
		m.delay.Store(20)
	}
	rec := newRecorder()
	p := f.dial(t, addrs, &qrpc.PoolConfig{Config: slowDial, Observer: rec, Stall: -1, Failures: 1 << 20,
		RetryRatio: 1, RetryMinPerS: 1000, Hedge: qrpc.Hedge{Delay: time.Millisecond, Max: 1}})
	const calls = 20
	for range calls {
		if _, err := poolCall(p, 5*time.Second, "work", ""); err != nil {
			t.Fatal(err)
		}
	}
	inflight := func() int64 {
		n := int64(0)
		for _, a := range addrs {
			n += rec.get(a).inflight.Load()
		}
		return n
	}
	// The losers are cancelled after the winner's answer is delivered.
	testwait.Until(t, "no attempt in flight", 5*time.Second, func() bool { return inflight() == 0 })
	var ok, failed, hedged int64
	for _, a := range addrs {
		r := rec.get(a)
		ok += r.ok.Load()
		failed += r.failed.Load()
		hedged += r.hedged.Load()
	}
	t.Logf("%d calls: %d copies, %d results ok, %d failed", calls, hedged, ok, failed)
	if hedged == 0 {
		t.Fatal("no copy sent")
	}
	if failed != 0 || ok < calls || ok > calls+hedged {
		t.Fatalf("%d calls answered, %d copies: %d results ok, %d failed; want %d to %d ok, none failed",
			calls, hedged, ok, failed, calls, calls+hedged)
	}
}

// TestPoolHedgeBudget: when every server is slow, hedged copies stay
// within the budget's ratio of the calls, and the refusals are counted.
func TestPoolHedgeBudget(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(3)
	for _, m := range f.srvs {
		m.delay.Store(60)
	}
	rec := newRecorder()
	p := f.dial(t, addrs, &qrpc.PoolConfig{Config: slowDial, Observer: rec, Stall: -1, Failures: 1 << 20,
		RetryRatio: 0.1, RetryMinPerS: -1, Hedge: qrpc.Hedge{Delay: 5 * time.Millisecond, Max: 2}})
	const calls = 400
	runCalls(t, 20, calls, func() error {
		_, err := poolCall(p, 5*time.Second, "work", "")
		return err
	})
	var hedged, refused int64
	for _, a := range addrs {
		hedged += rec.get(a).hedged.Load()
		refused += rec.get(a).budget.Load()
	}
	t.Logf("%d calls, all slow: %d copies, %d refused by the budget", calls, hedged, refused)
	if hedged > calls/10+1 {
		t.Fatalf("%d copies for %d calls: over the budget's 10 %%", hedged, calls)
	}
	if refused == 0 {
		t.Fatal("no copy refused by the budget")
	}
}

// TestPoolRetryBudgetError: a call whose retry the budget refuses fails
// with its own error, marked.
func TestPoolRetryBudgetError(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	p := f.dial(t, addrs, &qrpc.PoolConfig{Config: slowDial, Stall: -1, Failures: 1 << 20, Retries: 1,
		TryTimeout: 50 * time.Millisecond, RetryRatio: -1, RetryMinPerS: -1})
	f.srvs[0].freeze()
	f.srvs[1].freeze()
	_, err := poolCall(p, time.Second, "who", "")
	if !errors.Is(err, qrpc.ErrTimeout) || !strings.HasSuffix(err.Error(), "(1 attempt, retry budget exhausted)") {
		t.Fatalf("%v, want a timeout marked by the budget", err)
	}
}

// TestPoolEjectOn: a slow method called with a short timeout ejects a
// healthy server under the default rule, and never with timeouts left
// out of EjectOn.
func TestPoolEjectOn(t *testing.T) {
	for _, tc := range []struct {
		on    qrpc.Failure
		eject bool
	}{
		{0, true},
		{qrpc.FailConnect | qrpc.FailReset, false},
	} {
		f := newFleet(t)
		addrs := f.start(2)
		f.srvs[0].delay.Store(300)
		f.srvs[1].delay.Store(300)
		rec := newRecorder()
		p := f.dial(t, addrs, &qrpc.PoolConfig{Config: slowDial, Observer: rec, Stall: -1, Failures: 2, EjectOn: tc.on})
		for range 6 {
			if _, err := poolCall(p, 30*time.Millisecond, "work", ""); !errors.Is(err, qrpc.ErrTimeout) {
				t.Fatalf("on=%v: %v, want a timeout", tc.on, err)
			}
		}
		ejected := rec.get(addrs[0]).ejected.Load() + rec.get(addrs[1]).ejected.Load()
		if (ejected > 0) != tc.eject {
			t.Fatalf("on=%v: %d ejections, want ejection %v", tc.on, ejected, tc.eject)
		}
	}
}

// TestPoolHedgeP95: with delay "p95", no copy is sent until the pool has
// answers to measure; then a call that meets the slow server is answered
// by a copy sent after about the pool's 95th percentile.
func TestPoolHedgeP95(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(3)
	rec := newRecorder()
	p := f.dial(t, addrs, &qrpc.PoolConfig{Config: slowDial, Observer: rec, Stall: -1, Failures: 1 << 20,
		RetryMinPerS: 1000, Hedge: qrpc.Hedge{P95: true, Max: 1}})
	copies := func() int64 {
		n := int64(0)
		for _, a := range addrs {
			n += rec.get(a).hedged.Load()
		}
		return n
	}
	// Healthy: the estimate forms, and hardly a call needs a copy.
	healthy := runCalls(t, 10, 600, func() error {
		_, err := poolCall(p, 5*time.Second, "work", "")
		return err
	})
	before := copies()
	f.srvs[0].delay.Store(300)
	lat := runCalls(t, 10, 300, func() error {
		_, err := poolCall(p, 5*time.Second, "work", "")
		return err
	})
	got := copies() - before
	t.Logf("healthy p95 %v; one server 300 ms: p50 %v p99 %v, %d copies for 300 calls (%d while healthy)",
		percentile(healthy, 0.95), percentile(lat, 0.5), percentile(lat, 0.99), got, before)
	if got < 50 || got > 200 {
		t.Fatalf("%d copies for 300 calls with one server of three slow, want about a third", got)
	}
	if p99 := percentile(lat, 0.99); p99 >= 300*time.Millisecond {
		t.Fatalf("p99 %v: calls waited for the slow server", p99)
	}
}
