//go:build qrpctesthooks

package main

// qrpc_shutdown exists in test builds only: no host stops the runtime
// (a worker's Go runtime lives as long as the worker), and the C test
// host (ffi/testhost) uses it to check that the handle tables end empty.

import "C"

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
