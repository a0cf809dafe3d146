package main

// Go's side of queues.c: the submit ring's consumer and the completion
// queue's producers.

/*
#include "queues.h"
*/
import "C"

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// sqBatch is how many commands the consumer copies out per cgo call.
const sqBatch = 64

// sqCap is QRPC_SQ_CAP: commands the ring holds before refusing.
const sqCap = int(C.QRPC_SQ_CAP)

// submitRing is the consumer of the submit ring for one host generation.
type submitRing struct {
	efd  *os.File       // the eventfd the consumer blocks on; closed to stop it
	buf  unsafe.Pointer // C memory for sqBatch commands
	done chan struct{}  // closed when the consumer has returned
}

// openSubmitRing opens the ring and starts its consumer, which hands every
// command to run. The caller owns the result and stops it with close.
func openSubmitRing(run func(*cmdABI)) (*submitRing, error) {
	buf := cMalloc(sqBatch * int(unsafe.Sizeof(cmdABI{})))
	if buf == nil {
		return nil, fmt.Errorf("submit ring: out of memory")
	}
	fd := int(C.qrpc_sq_open())
	if fd < 0 {
		cFree(buf)
		return nil, fmt.Errorf("submit ring: eventfd: %w", syscall.Errno(-fd))
	}
	// Non-blocking fd: os.File registers it with Go's netpoller, so the
	// consumer parks as a goroutine, not as a blocked thread.
	r := &submitRing{efd: os.NewFile(uintptr(fd), "qrpc-submit-ring"), buf: buf, done: make(chan struct{})}
	go r.consume(run)
	return r, nil
}

func (r *submitRing) consume(run func(*cmdABI)) {
	defer close(r.done)
	defer recoverLog("submit ring")
	var ev [8]byte
	for {
		n := int(C.qrpc_sq_take((*C.qrpc_cmd_t)(r.buf), sqBatch))
		if n > 0 {
			for i := range unsafe.Slice((*cmdABI)(r.buf), n) {
				run(&unsafe.Slice((*cmdABI)(r.buf), n)[i])
			}
			C.qrpc_sq_release(C.int(n))
			continue
		}
		if C.qrpc_sq_sleep() == 0 {
			continue
		}
		if _, err := r.efd.Read(ev[:]); err != nil {
			return // closed: the host is shutting down
		}
	}
}

// close refuses new submits, stops the consumer and waits for it.
// Commands still in the ring are dropped: their calls were cancelled with
// the host generation.
func (r *submitRing) close() {
	C.qrpc_sq_close()
	_ = r.efd.Close()
	<-r.done
	cFree(r.buf)
}

// cqPush queues c in the C completion queue. ok is false when malloc
// failed (c.Data is still the caller's).
func cqPush(c *completionABI) (wasEmpty, ok bool) {
	rc := C.qrpc_cq_push((*C.qrpc_completion_t)(unsafe.Pointer(c)))
	return rc == 1, rc >= 0
}

// cqCounts returns the completions queued and, of those, the log lines.
func cqCounts() (n, logs int) {
	var cn, cl C.size_t
	C.qrpc_cq_counts(&cn, &cl)
	return int(cn), int(cl)
}

// cqClear frees every queued completion.
func cqClear() { C.qrpc_cq_clear() }

// cqDrain is qrpc_drain, for Go callers (tests).
func cqDrain(out []completionABI) int {
	if len(out) == 0 {
		return 0
	}
	return int(C.qrpc_drain((*C.qrpc_completion_t)(unsafe.Pointer(&out[0])), C.int(len(out))))
}

// sqSubmit is qrpc_sq_submit, for Go callers (tests): what Lua calls.
func sqSubmit(c *cmdABI) int32 {
	return int32(C.qrpc_sq_submit((*C.qrpc_cmd_t)(unsafe.Pointer(c))))
}

// sqConsumed is qrpc_sq_consumed, for Go callers (tests).
func sqConsumed() uint64 { return uint64(C.qrpc_sq_consumed()) }
