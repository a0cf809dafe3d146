package qrpc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

// TestThrottleFormula: the share of calls rejected is exactly
// max(0, (requests − K·accepts) / (requests + 1)) over the window, and a
// call is rejected when the draw falls under it.
func TestThrottleFormula(t *testing.T) {
	clk := newFakeClock()
	th := newThrottler(Throttle{K: 2, Codes: []uint32{8}})
	now := clk.Now()
	answer := func(code uint32) { th.record(now, &Response{Code: code}, nil) }
	for range 20 {
		answer(0)
	}
	for range 30 {
		answer(5) // an application code: an answer, an accept
	}
	for range 40 {
		th.record(now, nil, fmt.Errorf("%w: test", ErrTimeout))
	}
	for range 10 {
		answer(8) // overloaded
	}
	// Not a verdict on the servers: not counted.
	th.record(now, nil, context.Canceled)
	th.record(now, nil, ErrClosed)
	th.record(now, nil, fmt.Errorf("%w: big", ErrTooLarge))
	r, a := th.counts(now)
	if r != 100 || a != 50 {
		t.Fatalf("requests %d accepts %d, want 100 50", r, a)
	}
	if p := th.probability(now); p != 0 {
		t.Fatalf("p = %v with requests = 2×accepts, want 0", p)
	}
	for range 50 {
		th.record(now, nil, fmt.Errorf("%w: no server up", ErrUnavailable))
	}
	want := (150.0 - 2*50) / 151
	if p := th.probability(now); math.Abs(p-want) > 1e-12 {
		t.Fatalf("p = %v, want %v", p, want)
	}
	th.rnd = func() float64 { return want + 1e-9 }
	if !th.admit(now) {
		t.Fatal("a draw above p was rejected")
	}
	th.rnd = func() float64 { return want - 1e-9 }
	if th.admit(now) {
		t.Fatal("a draw under p was admitted")
	}
	// The rejected call is a request too.
	if r, _ := th.counts(now); r != 151 {
		t.Fatalf("requests %d after a rejection, want 151", r)
	}
}

// TestThrottleWindowSlides: counts leave the window two minutes after
// their second, not before.
func TestThrottleWindowSlides(t *testing.T) {
	clk := newFakeClock()
	th := newThrottler(Throttle{K: 2})
	th.record(clk.Now(), nil, ErrThrottled) // counted by admit only
	for range 10 {
		th.record(clk.Now(), nil, fmt.Errorf("%w: t", ErrTimeout))
	}
	clk.Advance(60 * time.Second)
	for range 5 {
		th.record(clk.Now(), &Response{}, nil)
	}
	if r, a := th.counts(clk.Now()); r != 15 || a != 5 {
		t.Fatalf("at 60 s: %d %d, want 15 5", r, a)
	}
	clk.Advance(59 * time.Second)
	if r, a := th.counts(clk.Now()); r != 15 || a != 5 {
		t.Fatalf("at 119 s: %d %d, want 15 5", r, a)
	}
	clk.Advance(2 * time.Second) // the first second's slot is out
	if r, a := th.counts(clk.Now()); r != 5 || a != 5 {
		t.Fatalf("at 121 s: %d %d, want 5 5", r, a)
	}
	clk.Advance(60 * time.Second)
	if r, a := th.counts(clk.Now()); r != 0 || a != 0 {
		t.Fatalf("at 181 s: %d %d, want 0 0", r, a)
	}
}

// TestThrottleEngagesAndReleases simulates a pool's callers on the fake
// clock: 20 calls a second; the servers answer, then fail for a minute,
// then answer again. Throttling stays off while they answer, sheds most
// calls while they fail, and lets everything through again once the
// failures have left the window.
func TestThrottleEngagesAndReleases(t *testing.T) {
	clk := newFakeClock()
	th := newThrottler(Throttle{K: 2})
	seed := uint64(1)
	th.rnd = func() float64 { // a fixed sequence: the test repeats exactly
		seed = seed*6364136223846793005 + 1442695040888963407
		return float64(seed>>11) / (1 << 53)
	}
	failing := false
	// run calls for secs seconds and returns the share rejected locally.
	run := func(secs int) float64 {
		rejected, n := 0, 0
		for range secs {
			for range 20 {
				n++
				clk.Advance(50 * time.Millisecond)
				if !th.admit(clk.Now()) {
					rejected++
					continue
				}
				if failing {
					th.record(clk.Now(), nil, fmt.Errorf("%w: no server up", ErrUnavailable))
				} else {
					th.record(clk.Now(), &Response{}, nil)
				}
			}
		}
		return float64(rejected) / float64(n)
	}
	if r := run(20); r != 0 {
		t.Fatalf("healthy: %.3f rejected, want 0", r)
	}
	failing = true
	first := run(10)
	mid := run(40)
	last := run(10)
	t.Logf("failing: %.3f, %.3f, %.3f rejected (failing: first 10 s, next 40 s, last 10 s)", first, mid, last)
	// With K = 2 and 400 accepts in the window, shedding starts once the
	// failures outnumber the accepts (after about 20 s), then climbs.
	if !(last > 0.35 && last > mid && mid >= first) {
		t.Fatalf("throttling does not engage: %.3f, %.3f, %.3f", first, mid, last)
	}
	failing = false
	var shares []float64
	for range 16 {
		shares = append(shares, run(10))
	}
	t.Logf("recovering, per 10 s: %.3f", shares)
	if shares[0] < 0.3 {
		t.Fatalf("released at once (%.3f): the failures are still in the window", shares[0])
	}
	for _, s := range shares[13:] {
		if s != 0 {
			t.Fatalf("still rejecting %.3f two minutes after the failures: %.3f", s, shares)
		}
	}
	for i := 1; i < len(shares); i++ {
		if shares[i] > shares[i-1]+0.05 {
			t.Fatalf("release not monotonic: %.3f", shares)
		}
	}
}

// TestThrottleConfig: k is 0 or at least 1; codes are bounded.
func TestThrottleConfig(t *testing.T) {
	for _, k := range []float64{-1, 0.5, math.NaN(), math.Inf(1)} {
		pc := &PoolConfig{Throttle: Throttle{K: k}}
		if _, _, err := pc.populate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("k = %v: %v, want bad config", k, err)
		}
	}
	pc := &PoolConfig{Throttle: Throttle{K: 2, Codes: make([]uint32, MaxThrottleCodes+1)}}
	if _, _, err := pc.populate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("too many codes: %v", err)
	}
	for _, k := range []float64{0, 1, 2} {
		pc := &PoolConfig{Throttle: Throttle{K: k, Codes: []uint32{8}}}
		if _, _, err := pc.populate(); err != nil {
			t.Errorf("k = %v: %v", k, err)
		}
	}
	if newThrottler(Throttle{}) != nil {
		t.Error("k = 0 is not off")
	}
}

// TestThrottledError: the error's words, as callers and metrics see them.
func TestThrottledError(t *testing.T) {
	if got := ErrorString(ErrThrottled); got != "unavailable: throttled" {
		t.Fatalf("ErrorString = %q", got)
	}
	if r := Classify(ErrThrottled); r.Word != WordUnavailable || r.Reason != ReasonThrottled || r.Detail != "" {
		t.Fatalf("Classify = %+v", r)
	}
	if !errors.Is(ErrThrottled, ErrUnavailable) || errors.Is(ErrThrottled, ErrNoServer) {
		t.Fatal("errors.Is")
	}
}
