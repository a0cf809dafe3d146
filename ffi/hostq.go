package main

// The Go side of the built-in host's C queues (hostq.c). The nginx thread
// queues UNARY and CANCEL commands with qrpc_submit_async, pops
// completions with qrpc_poll and frees their blocks with qrpc_release, all
// plain C: it never enters Go on the hot path. The submitter goroutine
// here sleeps in the netpoller on an eventfd, takes everything queued at
// once and runs each command as qrpc_submit would, turning a refusal into
// the call's completion.
//
// Why not call into Go from the nginx thread: after a cgo callback the
// thread keeps its P (a Go scheduler slot) while it runs nginx (Go 1.26,
// cgocallbackg -> reentersyscall), so the goroutines it readied wait on
// that P's runnext until a spinning thread steals them or sysmon retakes
// the P, and sysmon, finding a P in a syscall again and again, never
// slows its 20 µs tick (issue 13).

/*
#include <stdlib.h>
#include "qrpc.h"
#include "hostq.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
)

// trimEvery is how often the submitter's timer returns idle result blocks
// (bufcache) and idle command blocks (hostq.c), and takes back the blocks
// qrpc_release kept: qrpc_drain did the first on the dispatcher's poll,
// which no longer enters Go.
const trimEvery = 500 * time.Millisecond

// submitter owns the eventfd and the goroutines that serve the queues.
type submitter struct {
	mu   sync.Mutex
	f    *os.File      // the eventfd; nil when stopped
	stop chan struct{} // closed to stop the trimmer
	done sync.WaitGroup
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
	s.done.Add(2)
	go s.run(f)
	go s.trim(s.stop)
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
	close(stop)
	_ = f.Close()
	s.done.Wait()
}

func (s *submitter) run(f *os.File) {
	defer s.done.Done()
	var buf [8]byte
	for {
		if it := C.qrpc_submitq_take(); it != nil {
			runQueued(it)
			continue
		}
		if _, err := f.Read(buf[:]); err != nil {
			// Closed by halt: what was queued before the close runs now.
			runQueued(C.qrpc_submitq_take())
			return
		}
	}
}

func (s *submitter) trim(stop chan struct{}) {
	defer s.done.Done()
	defer rt.RecoverLog("qrpc trim")
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			takeReleased(C.qrpc_released_take())
			C.qrpc_submitq_trim(1)
			return
		case <-t.C:
			takeReleased(C.qrpc_released_take())
			cmem.Tick()
			C.qrpc_submitq_trim(0)
		}
	}
}

// takeReleased gives the blocks qrpc_release kept to the buffer cache.
func takeReleased(p unsafe.Pointer) {
	for p != nil {
		next := *(*unsafe.Pointer)(p)
		cmem.Free(p)
		p = next
	}
}

// runQueued runs and frees a list of queued commands, in order.
func runQueued(it *C.qrpc_qitem_t) {
	for it != nil {
		next := it.next
		runAsync((*cmdABI)(unsafe.Pointer(&it.cmd)))
		C.qrpc_submitq_free(it)
		it = next
	}
}

// runAsync runs one queued command; a UNARY that Submit refuses completes
// with the refusal, which Lua reports as qrpc_submit's error would be.
func runAsync(abi *cmdABI) {
	id := abi.CallID
	unary := abi.Op == bridge.OpUnary
	defer func() {
		if p := recover(); p != nil {
			rt.Logger().Error("qrpc panic in the submitter", "panic", fmt.Sprint(p))
			if unary {
				builtin.Complete(rt.Message(bridge.ErrGeneric, "internal error", id))
			}
		}
	}()
	var c bridge.Command
	status, msg := bridge.StatusOf(decodeCmd(abi, &c))
	if status == bridge.StatusOK {
		status, msg = rt.Submit(builtin, &c)
	}
	if status < 0 && unary {
		builtin.Complete(rt.Message(status, msg, id))
	}
}

// cqPush queues c in C: 1 when the queue was empty, 0 when not, -1 when
// closed, -2 when refused (no memory, or too many log lines).
func cqPush(c *bridge.Completion, maxLogs int) int {
	var rel unsafe.Pointer
	rc := int(C.qrpc_cq_push((*C.qrpc_completion_t)(unsafe.Pointer(c)), C.int(maxLogs), &rel))
	takeReleased(rel)
	return rc
}

func cqPoll(out []completionABI) int {
	if len(out) == 0 {
		return 0
	}
	return int(C.qrpc_poll((*C.qrpc_completion_t)(unsafe.Pointer(&out[0])), C.int(len(out))))
}

func cqLen() int  { return int(C.qrpc_cq_len()) }
func cqLogs() int { return int(C.qrpc_cq_logs()) }

// submitAsync, release: qrpc_submit_async and qrpc_release, for tests
// (which cannot use cgo).
func submitAsync(c *cmdABI) int32 {
	return int32(C.qrpc_submit_async((*C.qrpc_cmd_t)(unsafe.Pointer(c))))
}

func release(p unsafe.Pointer) { C.qrpc_release(p) }

func submitqCached() int { return int(C.qrpc_submitq_cached()) }
