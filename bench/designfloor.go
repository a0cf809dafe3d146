package main

// The floor of the design, with the network: the Go client's own calls,
// each handed to it by a thread that is not Go's and handed back, with
// nothing else in between. The ping-pong floor (handoff.go) times the
// hand-off alone, apart from the call; this one times both in one
// process, so that it also pays what the two threads cost each other
// (each runs on caches the other just used). What the module adds beyond
// it is its own software; what it costs beyond the Go client and is not
// in the module is the price of handing calls across threads at all.
//
// The host thread is a C thread (cgo), as the nginx thread is: a Go
// thread waiting in a system call would hold Go's one P. The ways:
//   - "eventfd": each call is submitted through an eventfd that a
//     goroutine reads through Go's netpoller, as the module's submitter
//     does, and answered through another that the host thread blocks on
//     in read(), the cheapest wake-up between two threads;
//   - "pickup": the same, but the goroutine looks for the next call
//     right after its answer's wake-up (the module's pickup, hostq): on
//     one CPU the woken host thread runs at once, submits, and leaves
//     the call in memory without a system call;
//   - "pickup-nginx": the pickup, with the answer woken as stock nginx
//     must be for a Lua light thread (a cosocket): one byte on a unix
//     socket the host thread waits for in epoll_wait().
//   - "export": no hand-off of ours: the host thread makes the call
//     inside a Go export (designfloor_export.go).

/*
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>

typedef struct {
	int to_go;   // eventfd Go's goroutine waits on
	int back;    // eventfd (blocking) or the unix socket's reading end
	int ep;      // epoll instance watching back; -1: read back directly
	int done;    // eventfd the host thread writes as it ends, error or not
	long n;
	long fail_at; // tests: the host thread fails before this call (0: never)
	int err;
	// pickup: armed by Go before its wake-up, when it looks for the next
	// call right after; the host thread then leaves the call in pending
	// instead of writing to_go.
	uint32_t armed;
	uint32_t pending;
} floor_host_t;

static int floor_submit(floor_host_t *h) {
	uint32_t one = 1, exp = 1;
	if (__atomic_compare_exchange_n(&h->armed, &exp, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
		__atomic_store_n(&h->pending, one, __ATOMIC_SEQ_CST);
		return 0;
	}
	uint64_t v = 1;
	return write(h->to_go, &v, 8) == 8 ? 0 : -1;
}

static int floor_calls(floor_host_t *h) {
	uint64_t v = 1;
	char buf[16];
	struct epoll_event ev;
	for (long i = 0; i < h->n; i++) {
		if (h->fail_at > 0 && i == h->fail_at) return EIO;
		if (floor_submit(h) != 0) return errno;
		if (h->ep < 0) {
			if (read(h->back, &v, 8) != 8) return errno;
			continue;
		}
		for (;;) {
			int r = epoll_wait(h->ep, &ev, 1, -1);
			if (r < 0 && errno == EINTR) continue;
			if (r < 0) return errno;
			ssize_t got = recv(h->back, buf, sizeof buf, MSG_DONTWAIT);
			if (got > 0) break;
			// edge-triggered: after an end of file no event comes again
			if (got == 0) return EPIPE;
			if (errno != EAGAIN && errno != EINTR) return errno;
		}
	}
	return 0;
}

// The host thread's end is written to done, so that Go's side, which may
// be waiting for a call that never comes, learns of an error.
static void *floor_host(void *arg) {
	floor_host_t *h = arg;
	uint64_t v = 1;
	h->err = floor_calls(h);
	while (write(h->done, &v, 8) < 0 && errno == EINTR) {}
	return 0;
}

static int floor_start(floor_host_t *h, pthread_t *t) {
	return pthread_create(t, 0, floor_host, h);
}

static int floor_join(pthread_t t) { return pthread_join(t, 0); }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// designFloor makes n sequential calls, each handed from a C thread to a
// goroutine and back (way: see above), and returns the time of the loop
// and how many calls the pickup took.
func designFloor(c *qrpc.Client, n, size int, way string) (el time.Duration, picks int, err error) {
	if way == "export" {
		el, err = exportFloor(c, n, size)
		return el, 0, err
	}
	toGo, _, e := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if e != 0 {
		return 0, 0, fmt.Errorf("eventfd: %w", e)
	}
	f := os.NewFile(toGo, "floor-submit") // non-blocking: Go's netpoller
	defer f.Close()
	doneFd, _, e := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if e != 0 {
		return 0, 0, fmt.Errorf("eventfd: %w", e)
	}
	done := os.NewFile(doneFd, "floor-done")
	defer done.Close()
	// freed once the host thread is joined: after an error it may still
	// read it (the process exits with the error)
	h := (*C.floor_host_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.floor_host_t{}))))
	h.to_go, h.n, h.ep, h.done = C.int(toGo), C.long(n), -1, C.int(doneFd)
	h.fail_at = C.long(floorFailAt)
	var backW int // where Go writes the answer's wake-up
	switch way {
	case "eventfd", "pickup":
		fd, _, e := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC, 0)
		if e != 0 {
			return 0, 0, fmt.Errorf("eventfd: %w", e)
		}
		defer syscall.Close(int(fd))
		h.back, backW = C.int(fd), int(fd)
	case "pickup-nginx":
		sv, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return 0, 0, fmt.Errorf("socketpair: %w", err)
		}
		defer syscall.Close(sv[0])
		defer syscall.Close(sv[1])
		ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			return 0, 0, fmt.Errorf("epoll: %w", err)
		}
		defer syscall.Close(ep)
		// edge-triggered, as nginx registers its connections
		ev := syscall.EpollEvent{Events: uint32(syscall.EPOLLIN|syscall.EPOLLRDHUP) | 1<<31, Fd: int32(sv[1])}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, sv[1], &ev); err != nil {
			return 0, 0, fmt.Errorf("epoll_ctl: %w", err)
		}
		h.back, h.ep, backW = C.int(sv[1]), C.int(ep), sv[0]
	default:
		return 0, 0, fmt.Errorf("unknown hand-off %q", way)
	}
	body := make([]byte, size)
	errc := make(chan error, 1)
	armed := (*uint32)(unsafe.Pointer(&h.armed))
	pending := (*uint32)(unsafe.Pointer(&h.pending))
	go func() {
		var v [8]byte
		one := [8]byte{1}
		picked := false
		for i := 0; i < n; i++ {
			if !picked {
				if _, err := f.Read(v[:]); err != nil {
					errc <- fmt.Errorf("submit eventfd: %w", err)
					return
				}
			}
			picked = false
			resp, err := c.Unary(context.Background(), "echo", body)
			if err == nil && len(resp.Body) != size {
				err = errors.New("short echo")
			}
			if err != nil {
				errc <- err
				return
			}
			pickup := way == "pickup" || way == "pickup-nginx"
			if pickup && i+1 < n {
				atomic.StoreUint32(armed, 1)
			}
			// raw, as the module's waker writes its byte (hostq/wake.go)
			for {
				_, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(backW), uintptr(unsafe.Pointer(&one[0])), uintptr(wakeLen(way)))
				if e != syscall.EINTR {
					break
				}
			}
			if pickup && i+1 < n {
				// one CPU: the host thread ran at the wake-up and left
				// its next call here
				if atomic.CompareAndSwapUint32(pending, 1, 0) {
					picked = true
				} else if !atomic.CompareAndSwapUint32(armed, 1, 0) {
					// taken by a submit on its way: its call comes
					// here, once the host thread runs again
					for !atomic.CompareAndSwapUint32(pending, 1, 0) {
						syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
					}
					picked = true
				}
				if picked {
					picks++
				}
			}
		}
		errc <- nil
	}()
	// The host thread's end, seen in Go's netpoller: a goroutine parked
	// there costs the loop nothing.
	ended := make(chan error, 1)
	go func() {
		var v [8]byte
		_, err := done.Read(v[:])
		ended <- err
	}()
	start := time.Now()
	// The C thread runs outside Go's scheduler, as the nginx thread does;
	// this goroutine waits in Go, not in a cgo call that would hold its P.
	var t C.pthread_t
	if rc := C.floor_start(h, &t); rc != 0 {
		return 0, 0, fmt.Errorf("pthread_create: %d", int(rc))
	}
	select {
	case err := <-errc:
		if err != nil {
			// the host thread waits on: the child exits with the error
			return 0, 0, err
		}
	case err := <-ended:
		if err != nil {
			return 0, 0, fmt.Errorf("host thread's end: %w", err)
		}
		if h.err != 0 {
			// the goroutine may wait on for a call that never comes
			return 0, 0, fmt.Errorf("host thread: %w", syscall.Errno(h.err))
		}
		if err := <-errc; err != nil {
			return 0, 0, err
		}
	}
	rc := C.floor_join(t)
	el = time.Since(start)
	if rc != 0 || h.err != 0 {
		return 0, 0, fmt.Errorf("host thread: rc %d: %w", int(rc), syscall.Errno(h.err))
	}
	C.free(unsafe.Pointer(h))
	runtime.KeepAlive(f)
	runtime.KeepAlive(done)
	return el, picks, nil
}

// floorFailAt makes the host thread fail before that call (tests; 0:
// never).
var floorFailAt int

// wakeLen is what one wake-up writes: an eventfd takes 8 bytes, the
// module's wake-up socket one.
func wakeLen(way string) int {
	if way != "pickup-nginx" {
		return 8
	}
	return 1
}
