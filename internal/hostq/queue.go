package hostq

// The Go side of the built-in host's C queues (hostq.c). The nginx thread
// queues commands with qrpc_submit_async, pops completions with qrpc_vm_poll
// and frees their blocks with qrpc_release_n, all plain C: it never enters
// Go on the hot path. The submitter goroutine here sleeps in the
// netpoller on an eventfd, takes everything queued at once and runs each
// command, turning a refusal into the call's completion; the waker runs
// what was queued right after its wake byte (pickup).
//
// Why not call into Go from the nginx thread: after a cgo callback the
// thread keeps its P (a Go scheduler slot) while it runs nginx (Go 1.26,
// cgocallbackg -> reentersyscall), so the goroutines it readied wait on
// that P's runnext until a spinning thread steals them or sysmon retakes
// the P, and sysmon, finding a P in a syscall again and again, never
// slows its 20 µs tick.

/*
#include <stdlib.h>
#include "qrpc.h"
#include "hostq.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// trimEvery is how often the trimmer returns idle result blocks (bufcache)
// and idle command blocks (hostq.c), and takes back the blocks
// qrpc_release kept: the dispatcher's poll does not enter Go, so Go's own
// timer does it.
//
// The timer runs only while the queues are in use. An idle worker with a
// ticking timer wakes three of its threads twice a second (the timer's
// goroutine, the netpoller's timed epoll_wait, sysmon sleeping until the
// next timer): more than all else an idle worker does. So the trimmer
// stops once a whole tick saw no command and it keeps nothing (every
// cache given back: within two bufcache intervals of the last use), and
// the next command starts it again; a block released while it sleeps is
// freed at once (qrpc_release_n), not kept for it. As it stops, it gives the C heap's free pages back to the
// kernel (qrpc_heap_trim, hostq.c).
const trimEvery = 500 * time.Millisecond

// submitter owns the eventfd and the goroutines that serve the queues.
type submitter struct {
	mu   sync.Mutex
	f    *os.File      // the eventfd; nil when stopped
	stop chan struct{} // closed to stop the trimmer and the waker
	done sync.WaitGroup
	kick atomic.Pointer[chan struct{}] // the waker's; nil when stopped
	// runMu orders the commands: the submitter and the waker (pickup)
	// each hold it from taking a list to having run it.
	runMu sync.Mutex

	// The trimmer's state (see trimEvery). trimOn: its timer runs; a
	// user that finds it false and sets it sends trimWake. trimUsed: a
	// command ran since the trimmer's last tick. The user sets trimUsed
	// before it reads trimOn, the trimmer clears trimOn before it reads
	// trimUsed again, so one of them sees the other: a use never finds
	// the trimmer asleep without waking it.
	trimOn   atomic.Bool
	trimUsed atomic.Bool
	trimWake chan struct{}
	trims    atomic.Uint64 // ticks run, for tests
	stops    atomic.Uint64 // times it stopped (and trimmed the C heap), for tests
}

// start opens the queues and starts the goroutines; a no-op when running.
func (s *submitter) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		return nil
	}
	fd, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return fmt.Errorf("submit queue: eventfd: %w", errno)
	}
	// Non-blocking: reads wait in the netpoller, not on a thread.
	f := os.NewFile(fd, "qrpc-submitq")
	s.f, s.stop = f, make(chan struct{})
	C.qrpc_hostq_set_fd(C.int(fd))
	kick := make(chan struct{}, 1)
	s.kick.Store(&kick)
	s.trimWake = make(chan struct{}, 1)
	s.trimOn.Store(true) // started by a first use: keep it until idle
	s.done.Add(3)
	stop, trimWake := s.stop, s.trimWake
	safego.Go("submitter", func() { s.run(f) }, nil)
	safego.Go("trimmer", func() { s.trim(stop, trimWake) }, nil)
	safego.Go("waker", func() { s.waker(&kick, stop, f) }, nil)
	return nil
}

// stop closes the queues (qrpc_submit_async then answers
// QRPC_ERR_CLOSED), runs what was queued and waits for the goroutines.
func (s *submitter) halt() {
	s.mu.Lock()
	f, stop := s.f, s.stop
	s.f = nil
	s.mu.Unlock()
	if f == nil {
		return
	}
	C.qrpc_hostq_set_fd(-1)
	s.kick.Store(nil)
	close(stop)
	_ = f.Close()
	s.done.Wait()
	C.qrpc_done_free()
}

func (s *submitter) run(f *os.File) {
	defer s.done.Done()
	rc, err := f.SyscallConn()
	if err != nil {
		rt.Logger().Error("qrpc submit queue: no raw eventfd", "err", err.Error())
		return
	}
	// The eventfd is only a doorbell and its counter is never read: the
	// netpoller registers it edge-triggered, and an eventfd reports a new
	// edge on every write, read or not. Checking the queue itself is what
	// RawRead's callback does before each wait (after RawRead has reset
	// the fd's readiness), so a push that raced with the reset is found
	// there, not lost. That saves the two reads a wake-up cost (the one
	// that empties the counter and the one that finds it empty: 2 of the
	// 13 or so system calls a sequential call costs the worker).
	// The counter cannot fill: qrpc_submit_async adds 1 per wake-up, and
	// 2^64-2 of them would take over 500,000 years at a million a second.
	var taken *C.qrpc_qitem_t
	take := func(uintptr) bool {
		s.runMu.Lock()
		taken = sqTake()
		if taken == nil {
			s.runMu.Unlock()
			return false
		}
		return true // runMu held until runTaken
	}
	// Each command's panic is its own (runAsync); should the loop itself
	// panic, it serves on: without it no command would ever run again.
	for safego.Run("submitter", func() {
		for {
			if err := rc.Read(take); err != nil {
				// Closed by halt: what was queued before the close runs now.
				s.runMu.Lock()
				it := sqTake()
				s.runTaken(it)
				return
			}
			s.runTaken(taken)
		}
	}, nil) {
	}
}

// runTaken runs a list taken under runMu and releases runMu.
func (s *submitter) runTaken(it *C.qrpc_qitem_t) {
	defer s.runMu.Unlock()
	if runQueued(it) {
		// After the commands: their blocks are then on the lists the
		// trimmer's next tick looks at.
		s.used()
	}
}

// armPickup tells qrpc_submit_async that the queue will be looked at
// without its eventfd write (the waker's pickup, after its wake byte).
func armPickup() {
	qlock()
	hq.sleeping = 0
	qunlock()
}

// pickup takes and runs what was queued since the waker armed it. One
// call at a time on one CPU, the nginx thread runs as soon as the wake
// byte is written, submits its next call and sleeps, and Go goes on
// here: the call starts without the eventfd write, the netpoller's
// wake-up and the hop to the submitter goroutine. One list only: what
// was queued while it ran goes to the submitter (f: its eventfd), so
// that the waker is soon back to writing wake bytes.
func (s *submitter) pickup(f *os.File) {
	s.runMu.Lock()
	it := sqTake() // none: the submitter is marked asleep again
	if it == nil {
		s.runMu.Unlock()
		return
	}
	s.runTaken(it)
	if handBack() {
		// closed by halt meanwhile: then the submitter runs the rest
		_, _ = f.Write(eventfdOne[:])
	}
}

var eventfdOne = [8]byte{1}

// handBack ends a pickup: with the queue empty the submitter is marked
// asleep (the next push rings); true when commands were queued while the
// pickup ran, which the pickup's caller then rings the submitter for.
func handBack() bool {
	qlock()
	more := hq.sq_head != nil
	if !more {
		hq.sleeping = 1
	}
	qunlock()
	return more
}

// used tells the trimmer the queues are in use, and starts it if it
// stopped. Two loads when it runs: nothing on the hot path writes a
// shared line.
func (s *submitter) used() {
	if !s.trimUsed.Load() {
		s.trimUsed.Store(true)
	}
	if !s.trimOn.Load() && s.trimOn.CompareAndSwap(false, true) {
		select {
		case s.trimWake <- struct{}{}:
		default:
		}
	}
}

// waker writes the wake byte for completion pushes that found the queue
// empty (wakeSoon), after a Gosched: that puts it behind the goroutines
// runnable now, the other answers of a batch among them, which then join
// the queue before the nginx thread wakes. A kick that arrives while it
// writes is one more byte, never a lost one. Before the byte it arms its
// pickup (armPickup), after it runs what the woken thread queued
// (pickup). After a panic it writes the bytes it had taken on (a
// dispatcher waiting for one would sleep on), runs the pickup it had
// armed (no push rings for those commands) and goes on.
func (s *submitter) waker(kick *chan struct{}, stop chan struct{}, f *os.File) {
	defer s.done.Done()
	// Should it end for good, pushes write their bytes themselves again.
	defer s.kick.CompareAndSwap(kick, nil)
	var (
		owed  uint64
		armed bool
	)
	for safego.Run("waker", func() {
		for {
			select {
			case <-stop:
				return
			case <-*kick:
				runtime.Gosched()
				owed = builtin.wakeMask.Swap(0)
				safego.Inject("waker")
				armPickup()
				armed = true
				builtin.signalVMs(owed)
				owed = 0
				armed = false
				s.pickup(f)
			}
		}
	}, func() {
		builtin.signalVMs(owed)
		owed = 0
		if armed {
			// no push rang since armPickup: its commands wait for this
			armed = false
			s.pickup(f)
		}
	}) {
	}
}

// trim runs the trimmer: a timer of trimEvery while the queues are in use
// (trimOn), none while they are idle.
func (s *submitter) trim(stop, wake chan struct{}) {
	defer s.done.Done()
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			takeReleased(C.qrpc_released_take())
			C.qrpc_submitq_trim(1)
			C.qrpc_done_free()
			C.qrpc_small_trim()
			return
		case <-wake:
			// Sent only by the use whose CompareAndSwap turned trimOn
			// on, so never while the timer runs: a Reset here cannot
			// put off the ticks of a busy queue.
			trimAwake()
			t.Reset(trimEvery)
		case <-t.C:
			takeReleased(C.qrpc_released_take())
			cmem.Tick()
			C.qrpc_submitq_trim(0)
			C.qrpc_done_free()
			if smallIdle() {
				C.qrpc_small_trim()
			}
			s.trims.Add(1)
			if s.trimUsed.Swap(false) || !trimSleep() {
				continue
			}
			t.Stop()
			s.trimOn.Store(false)
			// A use that saw trimOn still true set trimUsed first.
			if s.trimUsed.Load() && s.trimOn.CompareAndSwap(false, true) {
				trimAwake()
				t.Reset(trimEvery)
				continue
			}
			C.qrpc_heap_trim()
			s.stops.Add(1)
		}
	}
}

// trimAwake tells qrpc_release_n the trimmer runs again: it may keep
// blocks for reuse.
func trimAwake() {
	qlock()
	hq.trim_asleep = 0
	qunlock()
}

// trimSleep reports whether nothing is kept that a later tick would give
// back, and if so marks the trimmer asleep for qrpc_release_n, under the
// lock that release takes: a block released after it is freed, not kept.
func trimSleep() bool {
	if cmem.Stats().Bytes > 0 || C.qrpc_submitq_cached() > 0 {
		return false
	}
	qlock()
	idle := hq.rel_head == nil && hq.done_head == nil
	for c := 0; idle && c < smallClasses; c++ {
		idle = hq.small[c] == nil
	}
	if idle {
		hq.trim_asleep = 1
	}
	qunlock()
	return idle
}

// hq is hostq.c's state (qrpc_hostq_t). Go reads and writes it under
// qlock without cgo calls: a cgo call, like a system call through Go's
// syscall package, wakes Go's sysmon when the runtime was idle, and
// sysmon then polls every 20 us for a millisecond (see hostq.c).
var hq = &C.qrpc_hostq

// qlock takes hostq.c's spinlock (q_lock there). Its holders do a few
// loads and stores. The nginx thread spins on it too, so a Go holder must
// not be descheduled by Go while it holds it: a goroutine preempted there
// (sysmon's 10 ms preemption, a stop for GC, another goroutine taking its
// P) would leave the event loop spinning in sched_yield until Go ran it
// again. procPin makes the holder non-preemptible (as sync.Pool does) from
// before the lock to qunlock; the kernel can still preempt its thread,
// which is what the sched_yield in both spins is for. Nothing between
// qlock and qunlock may allocate, block or call Gosched.
func qlock() {
	procPin()
	l := (*uint32)(unsafe.Pointer(&hq.lock))
	for spins := 0; !atomic.CompareAndSwapUint32(l, 0, 1); spins++ {
		if spins >= 64 && spins%16 == 0 {
			// raw: see hq
			syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
}

func qunlock() {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&hq.lock)), 0)
	procUnpin()
}

// procPin and procUnpin are the runtime's (sync.Pool's pin): while pinned,
// the goroutine is neither preempted nor stopped for GC.
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// sqTake takes every queued command (a list in queue order), or returns
// nil and records that the submitter goes to sleep. The flag is set under
// the lock that pushes take, so the next push writes the eventfd and no
// wake-up is lost (TestSubmitQueueNoLostWakeup).
func sqTake() (it *C.qrpc_qitem_t) {
	qlock()
	it = hq.sq_head
	hq.sq_head, hq.sq_tail, hq.sq_len = nil, nil, 0
	if it == nil {
		hq.sleeping = 1
	} else {
		hq.sleeping = 0
	}
	qunlock()
	return it
}

// smallIdle reports whether no small block was handed out (to a result
// here or a command in hostq.c, from a list or new) since it was last
// asked.
func smallIdle() bool {
	qlock()
	n := hq.small_used
	hq.small_used = 0
	qunlock()
	return n == 0
}

// smallAlloc returns a block of at least n bytes (n <= smallMax) from the
// blocks qrpc_release kept, or a new one (a cgo call) when none is left.
func smallAlloc(n int) unsafe.Pointer {
	c := 0
	for n > 64<<c {
		c++
	}
	qlock()
	p := hq.small[c]
	if p != nil {
		hq.small[c] = *(*unsafe.Pointer)(p)
		hq.small_n[c]--
		hq.small_used++
	}
	qunlock()
	if p != nil {
		return p
	}
	return C.qrpc_small_alloc_slow(C.int(c))
}

// smallMax is the largest block of the small classes (hostq.h).
const smallMax = 64 << (C.QRPC_SMALL_CLASSES - 1)

// smallClasses is how many small classes there are (hostq.h).
const smallClasses = C.QRPC_SMALL_CLASSES

// takeReleased gives the blocks qrpc_release kept to the buffer cache.
func takeReleased(p unsafe.Pointer) {
	for p != nil {
		next := *(*unsafe.Pointer)(p)
		cmem.Free(p)
		p = next
	}
}

// runQueued runs and frees a list of queued commands, in order. It
// reports whether the trimmer is wanted: a list of shared-pool steps only
// (what an idle worker queues, once a lease period) does not start it.
// Such a step's answer is freed when released, as the trimmer sleeps
// (qrpc_release_n), and its command block waits on the done list for the
// nginx thread's next command or poll, which frees it (item_keep_locked):
// at most a step's blocks wait, where the trimmer would wake Go's threads
// for a few ticks.
func runQueued(it *C.qrpc_qitem_t) (trim bool) {
	if it == nil {
		return false
	}
	first, last := it, it
	for ; it != nil; it = it.next {
		trim = trim || it.cmd.op != bridge.OpPoolShare
		runAsync((*bridge.CmdABI)(unsafe.Pointer(&it.cmd)))
		last = it
	}
	// Freed by C (qrpc_done_free) on the nginx thread's next call: free()
	// from here would be a cgo call.
	qlock()
	last.next = hq.done_head
	hq.done_head = first
	qunlock()
	return trim
}

// runAsync runs one queued command; one that Submit refuses completes
// with the refusal (all but CANCEL, which has no completion).
func runAsync(abi *bridge.CmdABI) {
	id := abi.CallID
	completes := abi.Op != bridge.OpCancel
	// qrpc_submit_async took only commands of open VMs: the outcome goes
	// to the queue of the VM that submitted it.
	v := builtin.VMAt(int(abi.VM))
	if v == nil {
		v = builtin.VM
	}
	defer safego.Recover("submitter", func() {
		if completes {
			v.Complete(rt.Message(bridge.ErrGeneric, "internal error", id))
		}
	})
	var c bridge.Command
	status, msg := bridge.StatusOf(bridge.DecodeCmd(abi, &c))
	if status == bridge.StatusOK {
		status, msg = rt.Submit(v, &c)
	}
	if status < 0 && completes {
		v.Complete(rt.Message(status, msg, id))
	}
}

// cqPush queues c in VM vm's queue in C: 1 when that queue was empty, 0
// when not, -1 when closed, -2 when refused (no memory, or too many log
// lines).
//
// It is qrpc_cq_push done in Go, without a cgo call (see hq); only a full
// ring goes to C, which grows it.
func cqPush(vm int, c *bridge.Completion, maxLogs int) int {
	isLog := c.Status == bridge.StatusLog
	qlock()
	rel := hq.rel_head
	hq.rel_head = nil
	rc := 0
	q := &hq.cq[vm]
	switch {
	case hq.fd < 0:
		rc = -1
	case isLog && q.logs >= C.uint64_t(maxLogs):
		rc = -2
	case q.len == q.cap:
		rc = 2 // grow, in C
	default:
		const size = unsafe.Sizeof(bridge.Completion{})
		i := (q.head + q.len) % q.cap
		slot := unsafe.Add(unsafe.Pointer(q.buf), uintptr(i)*size)
		// bytes: no write barrier for the pointers into C memory
		*(*[size]byte)(slot) = *(*[size]byte)(unsafe.Pointer(c))
		q.len++
		if isLog {
			q.logs++
		}
		if q.len == 1 {
			rc = 1
		}
	}
	qunlock()
	takeReleased(rel)
	if rc == 2 {
		rc = cqPushGrow(vm, c, maxLogs)
	}
	return rc
}

// cqPushGrow is qrpc_cq_push, which grows the ring. Apart, because a
// pointer passed to C escapes: inline, every completion pushed would be
// moved to the heap, not only the rare one that fills the ring.
//
//go:noinline
func cqPushGrow(vm int, c *bridge.Completion, maxLogs int) int {
	cc := new(bridge.Completion)
	*cc = *c
	var more unsafe.Pointer
	rc := int(C.qrpc_cq_push(C.int(vm), (*C.qrpc_completion_t)(unsafe.Pointer(cc)), C.int(maxLogs), &more))
	takeReleased(more)
	return rc
}

func cqPoll(vm int, out []bridge.Completion) int {
	if len(out) == 0 {
		return 0
	}
	return int(C.qrpc_vm_poll(C.int(vm), (*C.qrpc_completion_t)(unsafe.Pointer(&out[0])), C.int(len(out))))
}

// cqLen and cqLogs count VM vm's queue, or every VM's with vm < 0.
func cqLen(vm int) int  { return int(C.qrpc_cq_len(C.int(vm))) }
func cqLogs(vm int) int { return int(C.qrpc_cq_logs(C.int(vm))) }

func vmMarkOpen(vm int) { C.qrpc_vm_mark_open(C.int(vm)) }

// submitAsync, release: qrpc_submit_async and qrpc_release, for tests
// (which cannot use cgo).
func submitAsync(c *bridge.CmdABI) int32 {
	return int32(C.qrpc_submit_async((*C.qrpc_cmd_t)(unsafe.Pointer(c))))
}

func release(p unsafe.Pointer) { C.qrpc_release(p) }

// releaseN is qrpc_release_n, for tests.
func releaseN(ps []unsafe.Pointer) {
	if len(ps) > 0 {
		C.qrpc_release_n(&ps[0], C.int(len(ps)))
	}
}

func submitqCached() int { return int(C.qrpc_submitq_cached()) }

// smallKept is how many small blocks class c's list holds, for tests.
func smallKept(c int) int {
	qlock()
	defer qunlock()
	return int(hq.small_n[c])
}

// smallAllocs is how many blocks the small classes had to malloc, and
// smallTrim frees the kept ones, for tests.
func smallAllocs() uint64 { return uint64(C.qrpc_small_allocs()) }
func smallTrim()          { C.qrpc_small_trim() }

// doneWaiting is how many commands wait for qrpc_done_free, for tests.
func doneWaiting() int {
	qlock()
	defer qunlock()
	n := 0
	for it := hq.done_head; it != nil; it = it.next {
		n++
	}
	return n
}

// submitterState is the submit queue's length, whether the submitter is
// marked asleep (the next push rings it) and how many pushes have rung
// it, for tests.
func submitterState() (queued int, asleep bool, rings uint64) {
	qlock()
	defer qunlock()
	return int(hq.sq_len), hq.sleeping != 0, uint64(hq.rings)
}
