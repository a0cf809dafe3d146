package main

// The exported C functions, declared in internal/hostq/qrpc.h. Each one recovers, decodes
// its C arguments, calls the runtime (internal/bridge) or a host adapter,
// and encodes the answer.
//
// This file must not include qrpc.h: cgo re-declares every export from its
// Go signature (e.g. "int qrpc_query(void *cmd, ...)"), and C rejects the
// header's const-qualified prototypes as conflicting. The ABI is the same:
// every pointer is passed as an address, integers keep their C types.

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/hostq"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/restyhost"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// The process's (= nginx worker's) runtime, shared by both hosts, and its
// built-in host (internal/hostq; the lua-resty-ffi host is
// internal/restyhost).
var (
	rt      = hostq.Runtime()
	builtin = hostq.Builtin()
	cmem    = hostq.Mem()
)

func init() {
	// Loaded in a worker: size its Go runtime for nginx (see
	// bridge.DefaultGOMAXPROCS; libffi_init raises it for lua-resty-ffi)
	// before any goroutine starts.
	bridge.DefaultGOMAXPROCS(workerEnv)
}

// workerEnv reads libc's environment: the worker's, as nginx's env
// directives made it (Go's os.Getenv has the one the process started
// with).
func workerEnv(name string) (string, bool) { return cGetenv(name) }

func enterExport() { hostq.EnterExport() }
func leaveExport() { hostq.LeaveExport() }

//export qrpc_go_entries
func qrpc_go_entries() C.uint64_t { return C.uint64_t(hostq.GoEntries()) }

// qrpc_go_cgo_calls is Go's count of its calls into C (runtime.NumCgoCall):
// the built-in host's hot path makes none in the steady state
// (internal/hostq/queue.go, hq), which the nginx tests check.
//
//export qrpc_go_cgo_calls
func qrpc_go_cgo_calls() C.uint64_t { return C.uint64_t(runtime.NumCgoCall()) }

// exportPanic turns a panic in an export into an error status; it must be
// deferred directly by the export.
func exportPanic(rc *C.int, errBuf unsafe.Pointer, errLen C.size_t) {
	if p := recover(); p != nil {
		safego.Report("export", p, debug.Stack())
		// the word a caller compares, the panic as the detail (info.detail)
		errString(errBuf, uintptr(errLen), bridge.EncodeMessage("internal error", fmt.Sprint(p), 0, false))
		if rc != nil {
			*rc = C.int(bridge.ErrGeneric)
		}
	}
}

// qrpc_claim records this copy of the library as the process's
// (QRPC_LIBRARY, ffi/libid.go), or refuses when another copy runs here.
// The loader calls it right after loading the file, before anything
// that may fail, so that a later Lua VM finds the record whatever
// became of this load.
//
//export qrpc_claim
func qrpc_claim(errBuf *C.char, errLen C.size_t) (rc C.int) {
	enterExport()
	defer leaveExport()
	defer exportPanic(&rc, unsafe.Pointer(errBuf), errLen)
	if other := claimLibEnv(); other != "" {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), otherCopyErr(other).Error())
		return C.int(bridge.ErrGeneric)
	}
	return C.int(bridge.StatusOK)
}

//export qrpc_init
func qrpc_init(errBuf *C.char, errLen C.size_t) (rc C.int) {
	enterExport()
	defer leaveExport()
	defer exportPanic(&rc, unsafe.Pointer(errBuf), errLen)
	hostq.InstallSignalForwarders()
	if other := claimLibEnv(); other != "" {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), otherCopyErr(other).Error())
		return C.int(bridge.ErrGeneric)
	}
	if err := builtin.Init(); err != nil {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), err.Error())
		return C.int(bridge.ErrGeneric)
	}
	return C.int(bridge.StatusOK)
}

//export qrpc_vm_open
func qrpc_vm_open(name *C.char, nameLen C.size_t, token C.uint64_t, errBuf *C.char, errLen C.size_t) (rc C.int) {
	enterExport()
	defer leaveExport()
	defer exportPanic(&rc, unsafe.Pointer(errBuf), errLen)
	n, err := bridge.View(unsafe.Pointer(name), uintptr(nameLen), "name")
	if err == nil {
		var i int
		if i, err = builtin.VMOpen(string(n), uint64(token)); err == nil {
			return C.int(i)
		}
	}
	st, msg := bridge.StatusOf(err)
	errString(unsafe.Pointer(errBuf), uintptr(errLen), msg)
	return C.int(st)
}

//export qrpc_vm_wake_open
func qrpc_vm_wake_open(vm C.int, dir *C.char, dirLen C.size_t, path *C.char, pathLen C.size_t, errBuf *C.char, errLen C.size_t) (rc C.int) {
	enterExport()
	defer leaveExport()
	defer exportPanic(&rc, unsafe.Pointer(errBuf), errLen)
	fail := func(status int32, msg string) C.int {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), msg)
		return C.int(status)
	}
	if _, err := builtin.Gen(); err != nil {
		return fail(bridge.ErrClosed, err.Error())
	}
	v := builtin.VMAt(int(vm))
	if v == nil {
		return fail(bridge.ErrBadArg, fmt.Sprintf("bad command: vm must be 0..%d, got %d", hostq.MaxVMs-1, int(vm)))
	}
	d, err := bridge.View(unsafe.Pointer(dir), uintptr(dirLen), "dir")
	if err != nil {
		return fail(bridge.StatusOf(err))
	}
	room := int(min(uintptr(pathLen), 1<<20))
	if path == nil {
		room = 0
	}
	p, err := v.WakeOpen(string(d), room)
	if err != nil {
		return fail(bridge.StatusOf(err))
	}
	errString(unsafe.Pointer(path), uintptr(pathLen), p)
	return C.int(bridge.StatusOK)
}

//export qrpc_query
func qrpc_query(cmd unsafe.Pointer, out *unsafe.Pointer, outLen *C.size_t, errBuf *C.char, errLen C.size_t) (rc C.int) {
	enterExport()
	defer leaveExport()
	defer exportPanic(&rc, unsafe.Pointer(errBuf), errLen)
	if out == nil || outLen == nil {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), "bad command: NULL out or out_len")
		return C.int(bridge.ErrBadArg)
	}
	*out, *outLen = nil, 0
	var c bridge.Command
	var res bridge.Completion
	var msg string
	if err := bridge.DecodeCmd((*bridge.CmdABI)(cmd), &c); err != nil {
		res.Status, msg = bridge.StatusOf(err)
	} else {
		res, msg = builtin.RunNow(&c)
	}
	if res.Status < 0 {
		errString(unsafe.Pointer(errBuf), uintptr(errLen), msg)
	} else {
		*out, *outLen = res.Data, C.size_t(res.Len)
	}
	return C.int(res.Status)
}

//export qrpc_stats
func qrpc_stats(conn C.uint64_t, out unsafe.Pointer) (rc C.int) {
	enterExport()
	defer leaveExport()
	defer exportPanic(&rc, nil, 0)
	if out == nil {
		return C.int(bridge.ErrBadArg)
	}
	s, err := rt.Stats(uint64(conn), builtin.QueuedAll())
	if err != nil {
		st, _ := bridge.StatusOf(err)
		return C.int(st)
	}
	*(*bridge.Stats)(out) = s
	return C.int(bridge.StatusOK)
}

//export libffi_init
func libffi_init(cfg *C.char, tq unsafe.Pointer) (rc C.int) {
	enterExport()
	defer leaveExport()
	defer exportPanic(&rc, nil, 0)
	hostq.InstallSignalForwarders()
	var c string
	if cfg != nil {
		c = C.GoString(cfg) // copied: lua-resty-ffi frees cfg after the call
	}
	if err := restyhost.Init(rt, c, tq); err != nil {
		bridge.StderrLog(bridge.NgxLogErr, "qrpc: libffi_init failed: "+err.Error())
		return C.int(bridge.ErrGeneric)
	}
	bridge.RestyFFIGOMAXPROCS()
	return C.int(bridge.StatusOK)
}

// errString writes msg NUL-terminated into buf (truncated to fit).
func errString(buf unsafe.Pointer, size uintptr, msg string) {
	if buf == nil || size == 0 {
		return
	}
	b := unsafe.Slice((*byte)(buf), size)
	n := copy(b[:size-1], msg)
	b[n] = 0
}
