package main

// The Go side of the built-in host's submit queue (submitq.c). The nginx
// thread queues UNARY and CANCEL commands in C with qrpc_submit_async and
// never enters Go for them; the submitter goroutine here sleeps in the
// netpoller on an eventfd, takes everything queued at once and runs each
// command as qrpc_submit would, turning a refusal into the call's
// completion.
//
// Why not call into Go from the nginx thread, as qrpc_submit does: that
// thread then keeps a P (a Go scheduler slot) while it runs nginx, so the
// goroutines a submit wakes (quic-go's connection loop) wait on that P
// until a spinning thread or sysmon takes them, and sysmon, which retakes
// the P again and again, never slows its 20 µs tick. perf of the worker
// under wrk: sysmon 14 % and scheduler park/wake 14 % of its CPU. With the
// queue, the worker's CPU per HTTP request fell by about a fifth (issue 13,
// measured in the report of branch workercpu).

/*
#include <stdlib.h>
#include "qrpc.h"
#include "submitq.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
)

// submitter owns the eventfd and the goroutine that serves the queue.
type submitter struct {
	mu   sync.Mutex
	f    *os.File      // the eventfd; nil when stopped
	done chan struct{} // closed when the goroutine has returned
}

// start opens the queue and starts the goroutine; a no-op when running.
func (s *submitter) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		return nil
	}
	const efdNonblock, efdCloexec = syscall.O_NONBLOCK, syscall.O_CLOEXEC
	fd, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, efdNonblock|efdCloexec, 0)
	if errno != 0 {
		return fmt.Errorf("submit queue: eventfd: %w", errno)
	}
	// Non-blocking: reads wait in the netpoller, not on a thread.
	f := os.NewFile(fd, "qrpc-submitq")
	s.f, s.done = f, make(chan struct{})
	C.qrpc_submitq_set_fd(C.int(fd))
	go s.run(f, s.done)
	return nil
}

// stop closes the queue (qrpc_submit_async then answers QRPC_ERR_CLOSED),
// runs what was queued and waits for the goroutine.
func (s *submitter) stop() {
	s.mu.Lock()
	f, done := s.f, s.done
	s.f = nil
	s.mu.Unlock()
	if f == nil {
		return
	}
	C.qrpc_submitq_set_fd(-1)
	_ = f.Close()
	<-done
}

func (s *submitter) run(f *os.File, done chan struct{}) {
	defer close(done)
	var buf [8]byte
	for {
		if it := C.qrpc_submitq_take(); it != nil {
			runQueued(it)
			continue
		}
		if _, err := f.Read(buf[:]); err != nil {
			// Closed by stop: what was queued before the close runs now.
			runQueued(C.qrpc_submitq_take())
			return
		}
	}
}

// runQueued runs and frees a list of queued commands, in order.
func runQueued(it *C.qrpc_qitem_t) {
	for it != nil {
		next := it.next
		runAsync((*cmdABI)(unsafe.Pointer(&it.cmd)))
		C.free(unsafe.Pointer(it))
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

// submitAsync is qrpc_submit_async, for tests (which cannot use cgo).
func submitAsync(c *cmdABI) int32 {
	return int32(C.qrpc_submit_async((*C.qrpc_cmd_t)(unsafe.Pointer(c))))
}
