package main

// The exported C functions, declared in qrpc.h. They are thin: recover,
// convert C types, call the Go-typed host code.
//
// This file must not include qrpc.h: cgo re-declares every export from its
// Go signature (e.g. "int qrpc_submit(void *cmd, ...)"), and C rejects the
// header's const-qualified prototypes as conflicting. The ABI is the same:
// every pointer is passed as an address, integers keep their C types.

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// exportPanic turns a panic in an export into an error status; it must be
// deferred directly by the export.
func exportPanic(rc *C.int, errBuf unsafe.Pointer, errLen C.size_t) {
	if p := recover(); p != nil {
		msg := fmt.Sprintf("internal error: %v", p)
		rt.logger.Error("qrpc panic in an export", "panic", fmt.Sprint(p))
		errString(errBuf, uintptr(errLen), clip(msg))
		if rc != nil {
			*rc = C.int(errGeneric)
		}
	}
}

//export qrpc_init
func qrpc_init(errBuf *C.char, errLen C.size_t) (rc C.int) {
	defer exportPanic(&rc, unsafe.Pointer(errBuf), errLen)
	installSignalForwarders()
	if err := builtin.init(); err != nil {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), err.Error())
		return C.int(errGeneric)
	}
	return C.int(statusOK)
}

//export qrpc_wake_open
func qrpc_wake_open(dir *C.char, dirLen C.size_t, path *C.char, pathLen C.size_t, errBuf *C.char, errLen C.size_t) (rc C.int) {
	defer exportPanic(&rc, unsafe.Pointer(errBuf), errLen)
	fail := func(status int32, msg string) C.int {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), msg)
		return C.int(status)
	}
	if builtin.current() == nil {
		return fail(errClosed, errNotInit.Error())
	}
	d, err := cbytes(unsafe.Pointer(dir), uintptr(dirLen), "dir")
	if err != nil {
		return fail(statusOf(err))
	}
	room := int(min(uintptr(pathLen), 1<<20))
	if path == nil {
		room = 0
	}
	p, err := builtin.wake.open(string(d), room, func() {
		if builtin.queued() > 0 {
			builtin.wake.signal()
		}
	})
	if err != nil {
		return fail(statusOf(err))
	}
	errString(unsafe.Pointer(path), uintptr(pathLen), p)
	return C.int(statusOK)
}

//export qrpc_submit
func qrpc_submit(cmd unsafe.Pointer, errBuf *C.char, errLen C.size_t) (rc C.int) {
	defer exportPanic(&rc, unsafe.Pointer(errBuf), errLen)
	status, msg := builtin.submit((*cmdABI)(cmd))
	if status < 0 {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), msg)
	}
	return C.int(status)
}

//export qrpc_stats
func qrpc_stats(conn C.uint64_t, out unsafe.Pointer) (rc C.int) {
	defer exportPanic(&rc, nil, 0)
	if out == nil {
		return C.int(errBadArg)
	}
	s, err := builtin.stats(uint64(conn))
	if err != nil {
		st, _ := statusOf(err)
		return C.int(st)
	}
	*(*statsABI)(out) = s
	return C.int(statusOK)
}

//export qrpc_drain
func qrpc_drain(out unsafe.Pointer, maxN C.int) (n C.int) {
	defer exportPanic(nil, nil, 0) // n stays 0: a negative count would confuse the caller
	if out == nil || maxN <= 0 {
		return 0
	}
	return C.int(builtin.drain(unsafe.Slice((*completionABI)(out), int(maxN))))
}

//export qrpc_free
func qrpc_free(p unsafe.Pointer) {
	defer exportPanic(nil, nil, 0)
	cFree(p)
}

//export qrpc_shutdown
func qrpc_shutdown() {
	defer exportPanic(nil, nil, 0)
	builtin.shutdown()
}

//export libffi_init
func libffi_init(cfg *C.char, tq unsafe.Pointer) (rc C.int) {
	defer exportPanic(&rc, nil, 0)
	installSignalForwarders()
	var c string
	if cfg != nil {
		c = C.GoString(cfg) // copied: lua-resty-ffi frees cfg after the call
	}
	if _, err := restyInit(c, tq); err != nil {
		stderrLog(ngxLogErr, "qrpc: libffi_init failed: "+err.Error())
		return C.int(errGeneric)
	}
	return C.int(statusOK)
}
