// Package cmdtest builds qrpc_cmd_t values (bridge.CmdABI) as a C caller
// fills them, for the tests of the packages that read them.
package cmdtest

import (
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
)

// Ptr returns the address of b's first byte and its length, as a C caller
// fills a (pointer, length) pair.
func Ptr(b []byte) (unsafe.Pointer, uintptr) {
	if len(b) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&b[0]), uintptr(len(b))
}

// Unary is the command of a unary call on conn (call id 7) with hdrs as
// alternating keys and values.
func Unary(conn uint64, method, body string, hdrs ...string) *bridge.CmdABI {
	c := &bridge.CmdABI{Version: bridge.CmdVersion, Op: bridge.OpUnary, Conn: conn, CallID: 7, NHdrs: uint32(len(hdrs))}
	c.Method, c.MethodLen = Ptr([]byte(method))
	c.Body, c.BodyLen = Ptr([]byte(body))
	c.Hdrs, c.HdrsLen = Ptr(bridge.PackHeaders(hdrs...))
	return c
}
