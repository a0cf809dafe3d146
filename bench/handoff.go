package main

// The floor of any two-thread design for sequential calls on one CPU:
// the nginx thread cannot run Go's network loop (it must return to nginx's
// event loop), so each call crosses from the nginx thread to a Go thread
// and back. Pinned to one CPU that is at least two context switches and
// four system calls (each side wakes the other, then waits) on top of what
// the Go client does. This measures exactly that, two threads pinned to
// CPU 0 waking each other through eventfds, with nothing else, so that the
// placement section can show how close to the floor the module is.

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// runPingPong is the child's side (-pingpong n): n round trips between
// two locked threads, printed as "SECS x".
func runPingPong(n int) error {
	el, err := pingPongHere(n)
	if err != nil {
		return err
	}
	fmt.Printf("SECS %.9f\n", el.Seconds())
	return nil
}

// pingPongHere times n round trips in this process. It needs GOMAXPROCS
// >= 2: each thread blocks in a raw read holding its P.
func pingPongHere(n int) (time.Duration, error) {
	if runtime.GOMAXPROCS(0) < 2 {
		return 0, fmt.Errorf("ping-pong needs GOMAXPROCS >= 2, have %d", runtime.GOMAXPROCS(0))
	}
	var fds [2]uintptr
	for i := range fds {
		fd, _, e := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC, 0)
		if e != 0 {
			return 0, fmt.Errorf("eventfd: %w", e)
		}
		fds[i] = fd
	}
	defer syscall.Close(int(fds[0]))
	defer syscall.Close(int(fds[1]))
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		for i := 0; i < n; i++ {
			if err := efdRead(fds[0]); err != nil {
				errc <- err
				return
			}
			if err := efdWrite(fds[1]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := efdWrite(fds[0]); err != nil {
			return 0, err
		}
		if err := efdRead(fds[1]); err != nil {
			return 0, err
		}
	}
	el := time.Since(start)
	if err := <-errc; err != nil {
		return 0, err
	}
	return el, nil
}

// efdRead and efdWrite are raw, as the module's hand-off is (internal/hostq/queue.go):
// through the syscall package they would also run Go's syscall bookkeeping.
func efdRead(fd uintptr) error  { return efdRaw(syscall.SYS_READ, "read", fd) }
func efdWrite(fd uintptr) error { return efdRaw(syscall.SYS_WRITE, "write", fd) }

// efdRaw reads or writes one eventfd counter value (a write adds 1).
func efdRaw(op uintptr, what string, fd uintptr) error {
	v := uint64(1)
	for {
		_, _, e := syscall.RawSyscall(op, fd, uintptr(unsafe.Pointer(&v)), 8)
		if e == syscall.EINTR {
			continue // Go's preemption signal
		}
		if e != 0 {
			return fmt.Errorf("eventfd %s: %w", what, e)
		}
		return nil
	}
}

// pingPong runs n round trips in a child pinned to CPU 0 and returns
// their time.
func pingPong(n int) (time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command("taskset", "-c", "0", self, "-pingpong", strconv.Itoa(n))
	cmd.Env = append(withoutEnv(os.Environ(), "GOMAXPROCS"), "GOMAXPROCS=2")
	return timedChild("ping-pong", cmd)
}
