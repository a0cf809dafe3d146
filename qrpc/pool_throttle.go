package qrpc

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Throttle is client-side adaptive throttling (the Google SRE book's,
// "Handling Overload"): over the last two minutes the pool counts its
// calls' outcomes, requests and accepts, and rejects each new call locally,
// before any server sees it, with probability
//
//	max(0, (requests − K·accepts) / (requests + 1))
//
// A healthy pool (every call accepted) rejects none; when the servers
// reject more than 1 − 1/K of the calls, the client sheds the excess
// itself, and lets it through again as answers come back. Calls shed
// count as requests (the book's rule), so from deep shedding the share
// let through grows about K-fold per window: measured with K = 2 (10
// calls a second), from 99 % shed to none took 6 to 10 minutes.
//
// A request is a call that ended with an answer, a reject, or was itself
// throttled. An accept is any answer of a server whose code is not in
// Codes (a non-zero application code is an answer too). A reject is a call
// that failed unavailable (no server up among them), timeout or connection
// lost (the transport failures), or was answered with a code in Codes.
// Calls cancelled by their caller, closed, too large or refused by a full
// send queue are no verdict on the servers and are not counted. Each call
// counts once, with its last outcome, whatever its retries and hedged
// copies did. One-way events are neither counted nor throttled.
type Throttle struct {
	// K is the multiplier of accepts (0: off, the default; otherwise at
	// least 1, the book suggests 2): the servers may reject up to
	// 1 − 1/K of the calls before the client sheds any.
	K float64
	// Codes are the response codes that mean "overloaded" (qrpc codes
	// are the application's: none by default, at most MaxThrottleCodes).
	Codes []uint32
}

// MaxThrottleCodes bounds Throttle.Codes.
const MaxThrottleCodes = 16

// ReasonThrottled is the reason of a call the pool's adaptive throttling
// rejected ("unavailable: throttled").
const ReasonThrottled = "throttled"

// ErrThrottled: the call was rejected by the pool's adaptive throttling,
// without being sent. Its message is "qrpc: unavailable: throttled"; it
// matches ErrUnavailable too.
var ErrThrottled error = throttledError{}

type throttledError struct{}

func (throttledError) Error() string { return ErrUnavailable.Error() + ": " + ReasonThrottled }

// Is makes errors.Is match ErrUnavailable as well.
func (throttledError) Is(target error) bool { return target == ErrUnavailable }

// ThrottleObserver is implemented by a PoolConfig.Observer that counts the
// calls adaptive throttling rejected: such a call has no server to be
// counted under.
type ThrottleObserver interface {
	Throttled(method []byte)
}

func (t *Throttle) validate() error {
	switch {
	case math.IsNaN(t.K) || math.IsInf(t.K, 0) || t.K < 0 || t.K > 0 && t.K < 1:
		// Under 1, a pool whose every call is answered would still shed.
		return fmt.Errorf("%w: throttle k must be 0 (off) or at least 1, got %v", ErrBadConfig, t.K)
	case len(t.Codes) > MaxThrottleCodes:
		return fmt.Errorf("%w: at most %d throttle codes, got %d", ErrBadConfig, MaxThrottleCodes, len(t.Codes))
	}
	return nil
}

const (
	// throttleWindow is the SRE book's two minutes, in throttleSlots
	// slots of throttleSlot.
	throttleSlot  = time.Second
	throttleSlots = 120
)

// throttler keeps a pool's request and accept counts over the window: one
// slot a second on the pool's clock (monotonic reading); a call adds to the
// current slot with one atomic add, and the sums of the other slots are
// computed once a second, when the slot turns (under mu).
type throttler struct {
	k     float64
	codes []uint32
	rnd   func() float64 // [0, 1); tests give their own

	mu       sync.Mutex
	cur      atomic.Int64 // the slot number (monoNS / throttleSlot) current holds
	idx      atomic.Int32 // its index in reqs/accs
	reqs     [throttleSlots]atomic.Int64
	accs     [throttleSlots]atomic.Int64
	secs     [throttleSlots]int64 // under mu: the slot number each index holds
	pastReqs atomic.Int64         // sums of the window's other slots
	pastAccs atomic.Int64
	// the other workers' window of a shared pool (pool_share.go)
	otherReqs atomic.Int64
	otherAccs atomic.Int64
}

func newThrottler(t Throttle) *throttler {
	if t.K == 0 {
		return nil
	}
	th := &throttler{k: t.K, codes: slices.Clone(t.Codes), rnd: rand.Float64}
	th.cur.Store(math.MinInt64)
	return th
}

// slot returns the index of now's slot, turning the window when now has
// moved into a new one.
func (th *throttler) slot(now time.Time) int {
	s := monoNS(now) / int64(throttleSlot)
	if th.cur.Load() == s {
		return int(th.idx.Load())
	}
	th.mu.Lock()
	defer th.mu.Unlock()
	if th.cur.Load() == s {
		return int(th.idx.Load())
	}
	i := int(uint64(s) % throttleSlots)
	if th.secs[i] != s {
		th.reqs[i].Store(0)
		th.accs[i].Store(0)
		th.secs[i] = s
	}
	var r, a int64
	for j := range throttleSlots {
		if j != i && s-th.secs[j] < throttleSlots && th.secs[j] <= s {
			r += th.reqs[j].Load()
			a += th.accs[j].Load()
		}
	}
	th.pastReqs.Store(r)
	th.pastAccs.Store(a)
	th.idx.Store(int32(i))
	th.cur.Store(s)
	return i
}

// counts returns the window's requests and accepts at now.
func (th *throttler) counts(now time.Time) (requests, accepts int64) {
	i := th.slot(now)
	return th.pastReqs.Load() + th.reqs[i].Load(), th.pastAccs.Load() + th.accs[i].Load()
}

// probability is the share of new calls to reject at now, over this
// pool's window and the other workers' of a shared one.
func (th *throttler) probability(now time.Time) float64 {
	r, a := th.counts(now)
	r += th.otherReqs.Load()
	a += th.otherAccs.Load()
	return max(0, (float64(r)-th.k*float64(a))/float64(r+1))
}

// admit decides whether a new call goes ahead; a call it rejects counts as
// a request (the book's: requests are what the application asked for).
func (th *throttler) admit(now time.Time) bool {
	p := th.probability(now)
	if p > 0 && th.rnd() < p {
		th.reqs[th.slot(now)].Add(1)
		return false
	}
	return true
}

// record counts a call's outcome at now (see Throttle).
func (th *throttler) record(now time.Time, resp *Response, err error) {
	accept := false
	switch {
	case err == nil && resp != nil:
		accept = !slices.Contains(th.codes, resp.Code)
	case errors.Is(err, ErrThrottled):
		return // counted by admit
	case !throttleReject(err):
		return
	}
	i := th.slot(now)
	th.reqs[i].Add(1)
	if accept {
		th.accs[i].Add(1)
	}
}

// throttleReject reports the errors that mean the servers could not take
// the call: unavailable (no server up included), timeout, connection lost.
func throttleReject(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrTimeout) ||
		errors.Is(err, ErrConnLost) || errors.Is(err, ErrDial)
}
