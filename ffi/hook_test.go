//go:build qrpctesthooks

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
	method := []byte("ev")
	cmd := &bridge.CmdABI{Version: bridge.CmdVersion, Op: bridge.OpEvent, Conn: 1,
		Method: unsafe.Pointer(&method[0]), MethodLen: uintptr(len(method))}
	var out unsafe.Pointer
	var outLen _Ctype_size_t
	if rc := qrpc_query(unsafe.Pointer(cmd), &out, &outLen, nil, 0); int(rc) != int(bridge.ErrGeneric) || out != nil {
		t.Fatalf("qrpc_query of an EVENT after a panic returned %d", rc)
	}
}
