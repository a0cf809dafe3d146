// Package threads ends the Go runtime's spare OS threads once a worker is
// idle. Go keeps every thread it ever starts; with one P (the built-in
// host's default GOMAXPROCS) an idle worker needs only the thread that
// ran the runtime's initialisation (m0), sysmon and the template thread,
// yet the first connect and call leave two more, parked for good.
//
// The runtime ends a thread in one case only: a goroutine locked to it
// (runtime.LockOSThread) exits without unlocking, except on m0, which it
// parks for good instead (it never lets m0 exit), losing the thread to
// the scheduler. So a pass locks, checks that it is not on m0, and exits
// locked. The thread's P must then go to another thread: with one P
// the runtime hands it at once to an idle thread (one parked in the
// scheduler's idle list), and creates a thread when there is none, which
// would make the pass churn threads instead of ending them. A pass
// therefore runs each step from a timer: the timer wakes the thread
// waiting in the netpoller while every other thread is parked idle (m0
// among them), so the step runs on that thread and ending it hands the P
// to a parked one. When the netpoller's thread is m0 itself, the step
// moves that role to another thread first: m0 waits in a system call,
// sysmon hands the P to a parked thread, which then waits in the
// netpoller, and m0 parks once the step is done.
package threads

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// m0 is the thread id of the runtime's first thread: package
// initialisation runs there (runtime.main locks itself to m0 for it).
var m0 = syscall.Gettid()

// fixed is the runtime's threads that are not spare: m0, sysmon and the
// template thread (started for a c-shared library, and by the first
// LockOSThread in a program).
const fixed = 3

const (
	// steps bounds a pass: each step ends one thread or moves the
	// netpoller off m0, which becomes the netpoller's thread again
	// after an end about every other time, so a pass over two spare
	// threads takes four steps or so; a busy worker (threads in system
	// calls, work arriving) makes a pass give up rather than spin.
	steps = 16
	// settle is the wait before each step: long enough for the thread
	// that ran the previous step to park, short enough that a pass of
	// a few steps is over within a tenth of a second or so.
	settle = 2 * time.Millisecond
	// m0Wait is m0's system call when it waits in the netpoller: sysmon
	// takes the P of a thread in a system call at the second of its
	// ticks that finds it there, and an idle sysmon ticks every 10 ms
	// (every 20 µs when the system call itself woke it). With 5 ms, m0
	// kept the netpoller for up to seven steps in a row.
	m0Wait = 25 * time.Millisecond
)

// Retirer runs passes; the zero value is ready.
type Retirer struct {
	running atomic.Bool
	wg      sync.WaitGroup
	retired atomic.Uint64 // threads ended, for tests
}

// Retire starts a pass unless one runs or the runtime has more than one
// P (there an ended thread's P may go to the netpoller's thread or wait
// for a new one, so ending threads would not reliably lower the count).
// The pass ends on its own within steps*(settle+m0Wait), or at once when
// stop is closed. Its goroutines count in Wait.
func (r *Retirer) Retire(stop <-chan struct{}) {
	if runtime.GOMAXPROCS(0) != 1 || spare() <= 0 || !r.running.CompareAndSwap(false, true) {
		return
	}
	r.wg.Add(1)
	go r.pass(stop, 0)
}

// Wait waits for the running pass, if any, to end. As with a
// sync.WaitGroup, no Retire may run concurrently with it.
func (r *Retirer) Wait() { r.wg.Wait() }

// Retired is the number of threads ended.
func (r *Retirer) Retired() uint64 { return r.retired.Load() }

// Running reports whether a pass runs.
func (r *Retirer) Running() bool { return r.running.Load() }

func (r *Retirer) pass(stop <-chan struct{}, step int) {
	defer r.wg.Done()
	t := time.NewTimer(settle)
	defer t.Stop()
	for ; step < steps; step++ {
		t.Reset(settle)
		select {
		case <-stop:
			r.running.Store(false)
			return
		case <-t.C:
		}
		// Counted after the wait: a thread that ends hands its P on
		// (and so starts this goroutine) before the runtime counts it
		// gone.
		if spare() <= 0 {
			break
		}
		runtime.LockOSThread()
		if syscall.Gettid() != m0 {
			// The pass goes on in a new goroutine, on the idle
			// thread that takes the P; this one ends its thread.
			r.retired.Add(1)
			r.wg.Add(1)
			go r.pass(stop, step+1)
			return
		}
		runtime.UnlockOSThread()
		m0Sleep()
	}
	r.running.Store(false)
}

// m0Sleep waits m0Wait in a system call that Go does not see through: a
// raw nanosleep through syscall.Syscall, which lets sysmon take the P.
func m0Sleep() {
	ts := syscall.NsecToTimespec(int64(m0Wait))
	syscall.Syscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// AfterGC calls f after each garbage collection (from the runtime's
// cleanup goroutine, so f must not block) until stop is closed. An idle
// Go runtime still collects every two minutes (forced by sysmon, on a
// wake-up it has anyway), so an owner can look for threads made while
// idle (a keep-alive's system call that sysmon took the P from hands it
// to a new thread when no other is parked) without a timer of its own.
func AfterGC(stop <-chan struct{}, f func()) {
	// Not a tiny allocation: the runtime may never run the cleanup of
	// an object that shares its block with others.
	sentinel := new([64]byte)
	runtime.AddCleanup(sentinel, func(struct{}) {
		select {
		case <-stop:
			return
		default:
		}
		f()
		AfterGC(stop, f)
	}, struct{}{})
}

var samples = []metrics.Sample{
	{Name: "/sched/threads/total:threads"},
	{Name: "/sched/goroutines/not-in-go:goroutines"},
}

var samplesMu sync.Mutex

// spare is the number of threads the runtime could end: its threads less
// the fixed ones and those held by goroutines in system calls or C.
func spare() int {
	samplesMu.Lock()
	defer samplesMu.Unlock()
	metrics.Read(samples)
	if samples[0].Value.Kind() != metrics.KindUint64 || samples[1].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int(samples[0].Value.Uint64()) - fixed - int(samples[1].Value.Uint64())
}
