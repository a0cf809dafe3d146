//go:build qrpctesthooks

package main

import (
	"strings"
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
	errBuf := make([]byte, 512)
	if rc := qrpc_query(unsafe.Pointer(cmd), &out, &outLen, (*_Ctype_char)(unsafe.Pointer(&errBuf[0])), _Ctype_size_t(len(errBuf))); int(rc) != int(bridge.ErrGeneric) || out != nil {
		t.Fatalf("qrpc_query of an EVENT after a panic returned %d", rc)
	}
	// the word a caller compares, the panic in the detail
	msg := string(errBuf[:strings.IndexByte(string(errBuf), 0)])
	if head, detail, _, _ := bridge.DecodeMessage(msg); head != "internal error" || !strings.Contains(detail, "injected in submit") {
		t.Errorf("message %q: want internal error, the panic in the detail", msg)
	}
	// a panic caught by the export itself says the same
	errBuf = make([]byte, 512)
	func() {
		defer exportPanic(nil, unsafe.Pointer(&errBuf[0]), _Ctype_size_t(len(errBuf)))
		panic("injected in an export")
	}()
	msg = string(errBuf[:strings.IndexByte(string(errBuf), 0)])
	if head, detail, _, _ := bridge.DecodeMessage(msg); head != "internal error" || !strings.Contains(detail, "injected in an export") {
		t.Errorf("export's own message %q: want internal error, the panic in the detail", msg)
	}
}
