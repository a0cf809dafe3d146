package qrpc

import (
	"sync"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// deadlines times out a qconn's calls with a few timers for the whole
// connection instead of one per call: time.AfterFunc per call
// cost two allocations and a runtime timer heap insert and delete, work
// that a call answered in microseconds never needed. Calls live in min-heaps
// ordered by deadline, sharded by request id like the pending map so that
// the submitter adding and the stream readers removing rarely contend.
//
// Each shard's timer is armed at its earliest deadline and left alone when
// that call is answered while others are still timed: it fires at most
// once per deadline span, finds nothing due, and re-arms for the next
// earliest. So a steady stream of calls with one timeout costs a timer
// operation per timeout period, not per call, and the heap only holds
// calls still in flight. The answer that empties a heap stops its timer:
// a timer left armed would wake an idle worker once at the last call's
// deadline for nothing (BenchmarkDeadlinesEmptying: the stop and the next
// call's re-arm cost tens of nanoseconds against a call's hundreds of
// microseconds).
type deadlines struct {
	shards [deadlineShards]deadlineShard
}

const deadlineShards = 8

// Positions of a call outside a heap (pendingCall.hidx).
const (
	hidxNew  = -1 // not added yet
	hidxDone = -2 // answered, failed or timed out: never added again
)

type deadlineShard struct {
	mu     sync.Mutex
	h      []*pendingCall // min-heap by deadline; pc.hidx is its index
	timer  *time.Timer    // created on the first add
	armed  time.Time      // when timer fires; zero: not armed
	closed bool
	expire func(*pendingCall)
	abort  func(*pendingCall)
	_      [40]byte // 128 bytes: shards on separate cache lines (TestDeadlineShardSize)
}

// init sets the function that times out a call and the one that fails
// it after a panic of the timer (the calls it had taken as due); both
// run on the timer's goroutine, outside every lock.
func (d *deadlines) init(expire, abort func(*pendingCall)) {
	for i := range d.shards {
		d.shards[i].expire = expire
		d.shards[i].abort = abort
	}
}

func (d *deadlines) shard(pc *pendingCall) *deadlineShard {
	return &d.shards[pc.id%deadlineShards]
}

// add starts timing pc (pc.deadline is set). A call already finished, or
// a closed qconn, is not added.
func (d *deadlines) add(pc *pendingCall) {
	sh := d.shard(pc)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed || pc.hidx == hidxDone {
		return
	}
	pc.hidx = len(sh.h)
	sh.h = append(sh.h, pc)
	sh.up(pc.hidx)
	if sh.armed.IsZero() || pc.deadline.Before(sh.armed) {
		sh.arm(pc.deadline)
	}
}

// remove stops timing pc, for good: an add after it does nothing (the
// answer can be read before the call's start has added it). The timer is
// left as it is unless the heap is now empty: see deadlines. A call
// without a deadline is never added, so its answer takes no lock here.
func (d *deadlines) remove(pc *pendingCall) {
	if pc.deadline.IsZero() {
		return
	}
	sh := d.shard(pc)
	sh.mu.Lock()
	if i := pc.hidx; i >= 0 {
		sh.delete(i)
		if len(sh.h) == 0 && !sh.armed.IsZero() {
			sh.timer.Stop()
			sh.armed = time.Time{}
		}
	}
	pc.hidx = hidxDone
	sh.mu.Unlock()
}

// close stops the timers and forgets every call (fail completes them).
func (d *deadlines) close() {
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		sh.closed = true
		for _, pc := range sh.h {
			pc.hidx = hidxDone
		}
		sh.h = nil
		if sh.timer != nil {
			sh.timer.Stop()
		}
		sh.armed = time.Time{}
		sh.mu.Unlock()
	}
}

// len counts the calls timed, for tests.
func (d *deadlines) len() int {
	n := 0
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		n += len(sh.h)
		sh.mu.Unlock()
	}
	return n
}

// arm sets the timer to fire at t. Under mu.
func (sh *deadlineShard) arm(t time.Time) {
	sh.armed = t
	wait := time.Until(t)
	if sh.timer == nil {
		sh.timer = safego.AfterFunc("deadline timer", wait, sh.fire, nil)
		return
	}
	sh.timer.Reset(wait)
}

// fire times out the calls that are due and re-arms for the next one.
// Timers never fire early; one that runs late (a loaded machine) takes
// everything due by then.
func (sh *deadlineShard) fire() {
	var due []*pendingCall
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return
	}
	now := time.Now()
	for len(sh.h) > 0 && !sh.h[0].deadline.After(now) {
		pc := sh.h[0]
		sh.delete(0)
		pc.hidx = hidxDone
		due = append(due, pc)
	}
	if len(sh.h) > 0 {
		sh.arm(sh.h[0].deadline)
	} else {
		sh.armed = time.Time{}
	}
	expire, abort := sh.expire, sh.abort
	sh.mu.Unlock()
	// The calls taken as due are the timer's alone: after a panic the
	// ones not yet timed out fail (abort) rather than wait for nothing.
	i := 0
	safego.Run("deadline timer", func() {
		for ; i < len(due); i++ {
			safego.Inject("deadline timer")
			expire(due[i])
		}
	}, func() {
		for ; i < len(due); i++ {
			abort(due[i])
		}
	})
}

// The heap, by hand: container/heap would box every call in an interface.

func (sh *deadlineShard) less(i, j int) bool { return sh.h[i].deadline.Before(sh.h[j].deadline) }

func (sh *deadlineShard) swap(i, j int) {
	sh.h[i], sh.h[j] = sh.h[j], sh.h[i]
	sh.h[i].hidx = i
	sh.h[j].hidx = j
}

func (sh *deadlineShard) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !sh.less(i, p) {
			return
		}
		sh.swap(i, p)
		i = p
	}
}

func (sh *deadlineShard) down(i int) {
	n := len(sh.h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && sh.less(r, l) {
			m = r
		}
		if !sh.less(m, i) {
			return
		}
		sh.swap(i, m)
		i = m
	}
}

// delete takes the call at index i out of the heap.
func (sh *deadlineShard) delete(i int) {
	last := len(sh.h) - 1
	if i != last {
		sh.swap(i, last)
	}
	sh.h[last] = nil
	sh.h = sh.h[:last]
	if i < last {
		sh.down(i)
		sh.up(i)
	}
	// A burst's backing array need not stay.
	if cap(sh.h) > 1024 && len(sh.h) < cap(sh.h)/4 {
		sh.h = append([]*pendingCall(nil), sh.h...)
	}
}
