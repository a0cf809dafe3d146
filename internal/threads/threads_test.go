package threads

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// tasks is the process's thread count (the test binary has no C threads).
func tasks(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// blockThreads makes the runtime start threads: n goroutines wait in a
// system call Go does not see through at the same time, so sysmon hands
// the P on to a new thread for each.
func blockThreads(n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts := syscall.NsecToTimespec(int64(20 * time.Millisecond))
			syscall.Syscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
		}()
	}
	wg.Wait()
}

// TestRetireEndsSpareThreads: after threads were started for goroutines
// in system calls, passes bring the process back to the runtime's fixed
// threads. The test's own goroutine may start a thread again between
// two looks (its sleeps, its system calls), so it runs passes until one
// look finds the process down to them.
func TestRetireEndsSpareThreads(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	// The template thread exists in a c-shared library from the start; in
	// a program the first LockOSThread starts it.
	runtime.LockOSThread()
	runtime.UnlockOSThread()
	stop := make(chan struct{})
	defer close(stop)
	for round := range 3 {
		blockThreads(4)
		before := tasks(t)
		if before < fixed+2 {
			t.Fatalf("round %d: %d threads after blocking 4 goroutines in system calls", round, before)
		}
		var r Retirer
		testwait.Until(t, "the process down to the runtime's fixed threads", 10*time.Second, func() bool {
			r.Retire(stop)
			r.Wait()
			return tasks(t) == fixed
		})
		t.Logf("round %d: %d threads, %d ended", round, before, r.Retired())
	}
}

func TestRetireStops(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	blockThreads(4)
	var r Retirer
	stop := make(chan struct{})
	close(stop)
	r.Retire(stop)
	r.Wait()
	if r.Retired() != 0 {
		t.Fatalf("a stopped pass ended %d threads", r.Retired())
	}
}

func TestRetireNeedsOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	blockThreads(4)
	var r Retirer
	r.Retire(make(chan struct{}))
	r.Wait()
	if r.Retired() != 0 {
		t.Fatalf("with 2 Ps a pass ended %d threads", r.Retired())
	}
}

func TestAfterGC(t *testing.T) {
	stop := make(chan struct{})
	var mu sync.Mutex
	calls := 0
	AfterGC(stop, func() {
		mu.Lock()
		calls++
		mu.Unlock()
	})
	n := func() int {
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
	// Each call arms the next collection's from the cleanup goroutine,
	// which may run after the collection that follows: each look
	// collects again.
	for want := 1; want <= 3; want++ {
		testwait.Until(t, fmt.Sprintf("call %d", want), 10*time.Second, func() bool {
			runtime.GC()
			return n() >= want
		})
	}
	close(stop)
	// A chain stopped before its collection never calls f; a second
	// chain shows when that collection's cleanups have run.
	stopped := make(chan struct{})
	close(stopped)
	var late atomic.Int32
	AfterGC(stopped, func() { late.Add(1) })
	marker := make(chan struct{})
	var seen atomic.Bool
	AfterGC(marker, func() { seen.Store(true) })
	testwait.Until(t, "the marker chain's call", 10*time.Second, func() bool {
		runtime.GC()
		return seen.Load()
	})
	close(marker)
	if late.Load() != 0 {
		t.Fatalf("a stopped chain called f %d times", late.Load())
	}
}
