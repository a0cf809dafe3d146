package qrpc

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// budgetWindow is the retry budget's memory, in one-second slots
// (Finagle's TTL).
const budgetWindow = 10

// retryBudget bounds a pool's retries and hedged copies to a share of its
// calls over the last budgetWindow seconds, plus a reserve so that a pool
// with few calls may still retry: withdrawals ≤ minPerS × window + ratio ×
// deposits. Deposits (every call) are one atomic add to the current
// second's slot; the lock is taken once a second, to reuse a slot.
type retryBudget struct {
	ratio   float64
	reserve float64

	mu    sync.Mutex
	secs  [budgetWindow]atomic.Int64 // the second (of monoNS) a slot counts
	calls [budgetWindow]atomic.Int64
	spent [budgetWindow]atomic.Int64
}

func newRetryBudget(ratio float64, minPerS int) *retryBudget {
	return &retryBudget{ratio: ratio, reserve: float64(minPerS) * budgetWindow}
}

// second is now's second on the monotonic clock: a step of the wall clock
// neither empties the budget nor keeps old slots alive.
func second(now time.Time) int64 { return monoNS(now) / int64(time.Second) }

func (b *retryBudget) slot(now time.Time) int {
	s := second(now)
	i := int(uint64(s) % budgetWindow)
	if b.secs[i].Load() != s {
		b.mu.Lock()
		if b.secs[i].Load() != s {
			b.calls[i].Store(0)
			b.spent[i].Store(0)
			b.secs[i].Store(s)
		}
		b.mu.Unlock()
	}
	return i
}

func (b *retryBudget) deposit(now time.Time) { b.calls[b.slot(now)].Add(1) }

// withdraw takes one retry (or hedged copy) from the budget, or reports
// that there is none left.
func (b *retryBudget) withdraw(now time.Time) bool {
	i := b.slot(now)
	s := second(now)
	var calls, spent int64
	for j := range budgetWindow {
		if s-b.secs[j].Load() < budgetWindow {
			calls += b.calls[j].Load()
			spent += b.spent[j].Load()
		}
	}
	if float64(spent+1) > b.reserve+b.ratio*float64(calls) {
		return false
	}
	b.spent[i].Add(1)
	return true
}

// refund gives back a withdrawal that was not used.
func (b *retryBudget) refund(now time.Time) { b.spent[b.slot(now)].Add(-1) }

// latencyHist estimates a pool's 95th percentile answer time, for hedging
// with delay "p95": log-spaced buckets (each 25 % wider than the last,
// from 100 µs), halved every latencyHalveEvery samples so that the
// estimate follows the recent past. The buckets count answers: the first
// latencyMinSamples answers each add 1; after them, to spare the call path
// an atomic add on counters every server of the pool shares, only one
// answer in latencySampleEvery is added, for latencySampleEvery (answer).
type latencyHist struct {
	// warm: the first latencyMinSamples answers are in. Set once, read by
	// every answer.
	warm    atomic.Bool
	buckets [latencyBuckets]atomic.Uint32
	n       atomic.Uint32 // samples added
}

const (
	latencyBuckets    = 64
	latencyBase       = 100 * time.Microsecond
	latencyGrowth     = 1.25
	latencyHalveEvery = 2048
	// latencyMinSamples: fewer answers than this give no estimate.
	latencyMinSamples = 20
	// latencySampleEvery: once warm, one answer in this many is added.
	latencySampleEvery = 4
)

var logLatencyGrowth = math.Log(latencyGrowth)

func latencyBucket(d time.Duration) int {
	if d <= latencyBase {
		return 0
	}
	i := int(math.Log(float64(d)/float64(latencyBase))/logLatencyGrowth) + 1
	return min(i, latencyBuckets-1)
}

// latencyUpper is bucket i's upper bound.
func latencyUpper(i int) time.Duration {
	return time.Duration(float64(latencyBase) * math.Pow(latencyGrowth, float64(i)))
}

// answer counts an answer that took d; calls is its server's count of
// calls started (peer.calls), whose low bits pick the answers sampled once
// the histogram is warm.
func (h *latencyHist) answer(d time.Duration, calls uint64) {
	if !h.warm.Load() {
		h.add(d, 1)
		return
	}
	if calls%latencySampleEvery == 0 {
		h.add(d, latencySampleEvery)
	}
}

// add adds a sample of d that stands for w answers.
func (h *latencyHist) add(d time.Duration, w uint32) {
	h.buckets[latencyBucket(d)].Add(w)
	n := h.n.Add(1)
	if n == latencyMinSamples {
		// Racing answers may add a few more at weight 1: an estimate is
		// enough.
		h.warm.Store(true)
	}
	if n%latencyHalveEvery == 0 {
		// Racing adds may be lost to the halving: an estimate is enough.
		for i := range h.buckets {
			h.buckets[i].Store(h.buckets[i].Load() / 2)
		}
	}
}

// p95 is the estimate, or 0 with too few samples.
func (h *latencyHist) p95() time.Duration {
	var counts [latencyBuckets]uint32
	total := uint64(0)
	for i := range h.buckets {
		counts[i] = h.buckets[i].Load()
		total += uint64(counts[i])
	}
	if total < latencyMinSamples {
		return 0
	}
	want := (total*95 + 99) / 100
	acc := uint64(0)
	for i, c := range counts {
		acc += uint64(c)
		if acc >= want {
			return latencyUpper(i)
		}
	}
	return latencyUpper(latencyBuckets - 1)
}
