package qrpc

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// expiry records what a deadlines' timer times out, and when.
type expiry struct {
	mu      sync.Mutex
	got     map[uint64]time.Time
	aborted []uint64 // failed after a panic of the timer ("timed out twice")
	ch      chan uint64
}

func newExpiry(d *deadlines) *expiry {
	e := &expiry{got: map[uint64]time.Time{}, ch: make(chan uint64, 1024)}
	d.init(func(pc *pendingCall) {
		e.mu.Lock()
		if _, dup := e.got[pc.id]; dup {
			panic("timed out twice")
		}
		e.got[pc.id] = time.Now()
		e.mu.Unlock()
		e.ch <- pc.id
	}, func(pc *pendingCall) {
		e.mu.Lock()
		e.aborted = append(e.aborted, pc.id)
		e.mu.Unlock()
	})
	return e
}

func (e *expiry) wait(t *testing.T, n int, within time.Duration) {
	t.Helper()
	timeout := time.After(within)
	for i := 0; i < n; i++ {
		select {
		case <-e.ch:
		case <-timeout:
			t.Fatalf("%d of %d calls timed out within %v", i, n, within)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.aborted) > 0 {
		t.Fatalf("the timer panicked (a call timed out twice?); calls failed after it: %v", e.aborted)
	}
}

func dlCall(id uint64, deadline time.Time) *pendingCall {
	return &pendingCall{id: id, deadline: deadline, hidx: hidxNew}
}

// Every call times out once, never before its deadline and not long
// after; a call added with an earlier deadline than the one the timer
// waits for re-arms it (else the 30 ms calls would wait for the 10 s one).
// The order a heap gives them up in is TestDeadlinesHeapInvariant's.
func TestDeadlinesFireWhenDue(t *testing.T) {
	var d deadlines
	e := newExpiry(&d)
	defer d.close()
	now := time.Now()
	long := dlCall(8, now.Add(10*time.Second))
	d.add(long)
	// ids that are multiples of 8 share the 10 s call's shard; the others
	// are in the next one
	offsets := []int{90, 30, 60, 30, 120, 45}
	var calls []*pendingCall
	for i, ms := range offsets {
		for _, id := range []uint64{uint64(16 + 8*i), uint64(17 + 8*i)} {
			pc := dlCall(id, now.Add(time.Duration(ms)*time.Millisecond))
			calls = append(calls, pc)
			d.add(pc)
		}
	}
	if n := d.len(); n != len(calls)+1 {
		t.Fatalf("len %d, want %d", n, len(calls)+1)
	}
	e.wait(t, len(calls), 5*time.Second)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, pc := range calls {
		at, ok := e.got[pc.id]
		if !ok {
			t.Fatalf("call %d not timed out", pc.id)
		}
		if at.Before(pc.deadline) {
			t.Errorf("call %d timed out %v before its deadline", pc.id, pc.deadline.Sub(at))
		}
		if late := at.Sub(pc.deadline); late > 3*time.Second {
			t.Errorf("call %d timed out %v late", pc.id, late)
		}
		if pc.hidx != hidxDone {
			t.Errorf("call %d hidx %d after its timeout", pc.id, pc.hidx)
		}
	}
	if _, ok := e.got[long.id]; ok {
		t.Fatal("the 10 s call timed out")
	}
	if n := d.len(); n != 1 {
		t.Fatalf("len %d after the timeouts, want 1 (the 10 s call)", n)
	}
}

// A removed call never times out and leaves nothing behind; one answered
// before its start added it (remove, then add) is not added at all; after
// close nothing fires and nothing is added.
func TestDeadlinesRemoveAndClose(t *testing.T) {
	// The calls must be removed before they are due, or the timer rightly
	// takes them: the margin grows with the machine (under -race on a
	// loaded one, 1000 adds and removes took more than 30 ms).
	var (
		d   *deadlines
		e   *expiry
		due time.Time
	)
	for margin := 30 * time.Millisecond; ; margin *= 2 {
		d = new(deadlines)
		e = newExpiry(d)
		due = time.Now().Add(margin)
		var calls []*pendingCall
		for id := uint64(1); id <= 1000; id++ {
			pc := dlCall(id, due)
			calls = append(calls, pc)
			d.add(pc)
		}
		early := dlCall(5000, due)
		d.remove(early)
		d.add(early)
		for _, pc := range calls {
			d.remove(pc)
		}
		if time.Now().Before(due) {
			break
		}
		d.close()
		if margin > 5*time.Second {
			t.Fatalf("1000 adds and removes took more than %v", margin)
		}
	}
	if n := d.len(); n != 0 {
		t.Fatalf("len %d after removing every call", n)
	}
	last := dlCall(6000, time.Now().Add(20*time.Millisecond))
	d.add(last)
	// A sentinel in every shard, due after the removed calls: a heap
	// gives its calls up earliest first, so once every sentinel has timed
	// out, a removed call left in a heap would have too.
	for id := uint64(6001); id <= 6000+deadlineShards; id++ {
		d.add(dlCall(id, due.Add(10*time.Millisecond)))
	}
	e.wait(t, 1+deadlineShards, 5*time.Second)
	if n := d.len(); n != 0 {
		t.Fatalf("len %d after the last timeout", n)
	}
	e.mu.Lock()
	if len(e.got) != 1+deadlineShards {
		t.Fatalf("%d calls timed out, want only call 6000 and the sentinels: %v", len(e.got), e.got)
	}
	e.mu.Unlock()

	late := dlCall(7000, time.Now().Add(20*time.Millisecond))
	d.add(late)
	d.close()
	d.add(dlCall(7001, time.Now()))
	// The window: until another heap's call, due 10 ms after late, has
	// timed out (a closed heap has no timer left to fire late).
	var other deadlines
	oe := newExpiry(&other)
	defer other.close()
	other.add(dlCall(7000, late.deadline.Add(10*time.Millisecond)))
	oe.wait(t, 1, 5*time.Second)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.got) != 1+deadlineShards {
		t.Fatalf("timed out after close: %v", e.got)
	}
	if n := d.len(); n != 0 {
		t.Fatalf("len %d after close", n)
	}
}

// The heap stays a heap whose calls know their index, through random adds
// and removes in every position, and gives its calls up earliest first.
func TestDeadlinesHeapInvariant(t *testing.T) {
	var d deadlines
	d.init(func(*pendingCall) {}, func(*pendingCall) {})
	defer d.close()
	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Now().Add(time.Hour)
	var live []*pendingCall
	// At most 300 calls (9 levels): checking every call after every
	// operation costs the square of the size. Phases that fill the heap
	// to that cap alternate with random walks.
	for op := 0; op < 10000; op++ {
		fill := (op/2500)%2 == 0
		if len(live) == 0 || len(live) < 300 && (fill || rng.IntN(2) == 0) {
			pc := dlCall(uint64(op)*deadlineShards, base.Add(time.Duration(rng.IntN(1e6))*time.Microsecond))
			d.add(pc)
			live = append(live, pc)
		} else {
			i := rng.IntN(len(live))
			d.remove(live[i])
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		sh := &d.shards[0]
		if len(sh.h) != len(live) {
			t.Fatalf("op %d: heap holds %d, want %d", op, len(sh.h), len(live))
		}
		for i, pc := range sh.h {
			if pc.hidx != i {
				t.Fatalf("op %d: call at %d says %d", op, i, pc.hidx)
			}
			if i > 0 && sh.less(i, (i-1)/2) {
				t.Fatalf("op %d: %d is due before its parent", op, i)
			}
		}
	}
	sh := &d.shards[0]
	var last time.Time
	for n := len(sh.h); n > 0; n-- {
		pc := sh.h[0]
		sh.delete(0)
		if pc.deadline.Before(last) {
			t.Fatalf("the heap gave up a call due %v before the one before it", last.Sub(pc.deadline))
		}
		last = pc.deadline
	}
}

// Shards fill whole cache lines, so that the submitter adding to one and a
// reader removing from the next do not share a line.
func TestDeadlineShardSize(t *testing.T) {
	if n := unsafe.Sizeof(deadlineShard{}); n%64 != 0 {
		t.Fatalf("a deadline shard is %d bytes, not a multiple of 64: adjust its padding", n)
	}
}

// pendingTimers counts the shards whose timer is still set to fire. Stop
// tells (it reports whether it stopped a timer set to fire), so it is
// called on every timer: only for a deadlines about to be dropped.
func pendingTimers(d *deadlines) int {
	n := 0
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		if sh.timer != nil && sh.timer.Stop() {
			n++
		}
		sh.mu.Unlock()
	}
	return n
}

// The answer that empties a heap leaves no timer set: an idle worker's
// last call must not wake it at its old deadline. An answer that leaves
// calls behind keeps the timer set for them, and a call added after the
// heap emptied is timed again.
func TestDeadlinesEmptyHeapStopsTimer(t *testing.T) {
	var d deadlines
	e := newExpiry(&d)
	defer d.close()
	far := time.Now().Add(time.Hour)
	a, b := dlCall(8, far), dlCall(16, far) // one shard
	d.add(a)
	d.add(b)
	d.remove(a)
	if sh := &d.shards[0]; sh.armed.IsZero() {
		t.Fatal("the timer stopped while a call was still timed")
	}
	d.remove(b)
	single := dlCall(3, far)
	d.add(single)
	d.remove(single)
	var other deadlines
	other.init(func(*pendingCall) {}, func(*pendingCall) {})
	for _, pc := range []*pendingCall{dlCall(1, far), dlCall(2, far)} {
		other.add(pc)
		other.remove(pc)
	}
	if n := pendingTimers(&other); n != 0 {
		t.Fatalf("%d timers still set after their heaps emptied", n)
	}
	// d's timers are stopped; one is set again by the next call.
	again := dlCall(24, time.Now().Add(20*time.Millisecond))
	d.add(again)
	e.wait(t, 1, 5*time.Second)
	if n := d.len(); n != 0 {
		t.Fatalf("len %d after the timeout", n)
	}
	if n := pendingTimers(&d); n != 0 {
		t.Fatalf("%d timers still set after the last timeout", n)
	}
}

// BenchmarkDeadlinesEmptying: a sequential caller's add and remove, whose
// remove empties the heap (the timer stopped, re-armed by the next add),
// against the same with another call held in the shard (the timer left
// set): what the stop costs a call.
func BenchmarkDeadlinesEmptying(b *testing.B) {
	for _, held := range []bool{false, true} {
		name := "empties"
		if held {
			name = "held"
		}
		b.Run(name, func(b *testing.B) {
			var d deadlines
			d.init(func(*pendingCall) {}, func(*pendingCall) {})
			defer d.close()
			// The held call is due first, so that the calls' adds find
			// the timer set early enough and leave it.
			if held {
				d.add(dlCall(0, time.Now().Add(time.Minute)))
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				pc := dlCall(uint64(i+1)*deadlineShards, time.Now().Add(time.Hour))
				d.add(pc)
				d.remove(pc)
			}
		})
	}
}
