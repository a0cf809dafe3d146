package main

import (
	"testing"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
)

// A panic inside an export, on the nginx thread, is an error status, not
// a crash. (The built-in host itself is internal/hostq's tests.)
func TestExportPanicBecomesError(t *testing.T) {
	if err := builtin.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(builtin.Shutdown)
	t.Cleanup(func() { bridge.SetTestHook(nil) })
	bridge.SetTestHook(func(where string) {
		if where == "submit" {
			panic("injected in submit")
		}
	})
	method := []byte("echo")
	cmd := &bridge.CmdABI{Version: bridge.CmdVersion, Op: bridge.OpUnary, Conn: 1, CallID: 2,
		Method: unsafe.Pointer(&method[0]), MethodLen: uintptr(len(method))}
	if rc := qrpc_submit(unsafe.Pointer(cmd), nil, 0); int(rc) != int(bridge.ErrGeneric) {
		t.Fatalf("qrpc_submit after a panic returned %d", rc)
	}
}
