//go:build qrpctesthooks

package main

// qrpc_shutdown exists in test builds only: no host stops the runtime
// (a worker's Go runtime lives as long as the worker), and the C test
// host (ffi/testhost) uses it to check that the handle tables end empty.

import "C"

import "github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"

// qrpc_shutdown fails pending calls, closes connections and the wake
// socket; safe to call more than once.
//
//export qrpc_shutdown
func qrpc_shutdown() {
	enterExport()
	defer leaveExport()
	defer exportPanic(nil, nil, 0)
	builtin.Shutdown()
	cmem.FreeAll()
}

// qrpc_test_arm makes the next n passes of the library's goroutines of
// kind where through their injection point panic (safego.Arm): the nginx
// suite's check that no goroutine can take the worker down.
//
//export qrpc_test_arm
func qrpc_test_arm(where *C.char, n C.int) {
	enterExport()
	defer leaveExport()
	defer exportPanic(nil, nil, 0)
	safego.Arm(C.GoString(where), int(n))
}

// qrpc_test_armed is how many of those panics are still to come.
//
//export qrpc_test_armed
func qrpc_test_armed(where *C.char) C.int {
	enterExport()
	defer leaveExport()
	defer exportPanic(nil, nil, 0)
	return C.int(safego.Armed(C.GoString(where)))
}
