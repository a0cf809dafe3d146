package main

import "unsafe"

// Go mirrors of the C types in qrpc.h. They let the decoding and encoding
// logic live in plain Go files (unit-testable: _test.go files cannot use
// cgo). cgo.go checks at start-up that every size and offset equals the C
// compiler's, so a drift between this file and qrpc.h disables the library
// instead of corrupting memory.

// Operation codes (qrpc_cmd_t.op).
const (
	opConnect = 1
	opUnary   = 2
	opEvent   = 3
	opClose   = 4
	opCancel  = 5
	opEcho    = 6
	opStats   = 7
)

// Status codes.
const (
	statusOK      int32 = 0
	statusPending int32 = 1
	statusLog     int32 = 2
	errGeneric    int32 = -1
	errTimeout    int32 = -2
	errClosed     int32 = -3
	errFull       int32 = -4
	errBadArg     int32 = -5
	errConnect    int32 = -6
	errUnavail    int32 = -7
	errTooBig     int32 = -8
	errLost       int32 = -9
)

// cmdVersion is QRPC_CMD_VERSION.
const cmdVersion = 1

// cmdABI is qrpc_cmd_t.
type cmdABI struct {
	Version       uint32
	Op            uint32
	Conn          uint64
	CallID        uint64
	TimeoutMS     int32
	NHdrs         uint32
	Method        unsafe.Pointer
	MethodLen     uintptr
	Body          unsafe.Pointer
	BodyLen       uintptr
	Hdrs          unsafe.Pointer
	HdrsLen       uintptr
	Addr          unsafe.Pointer
	AddrLen       uintptr
	ServerName    unsafe.Pointer
	ServerNameLen uintptr
	CA            unsafe.Pointer
	CALen         uintptr
	Cert          unsafe.Pointer
	CertLen       uintptr
	Key           unsafe.Pointer
	KeyLen        uintptr
	Pins          unsafe.Pointer
	PinsLen       uintptr
	Insecure      int32
	Conns         int32
	Streams       int32
	IdleTimeoutMS int32
	MaxFrameSize  int32
	Reserved      int32
}

// completionABI is qrpc_completion_t.
type completionABI struct {
	CallID uint64
	Handle uint64
	Status int32
	Code   uint32
	Data   unsafe.Pointer
	Len    uintptr
}

// statsABI is qrpc_stats_t.
type statsABI struct {
	Inflight   uint64
	Calls      uint64
	Events     uint64
	Dropped    uint64
	Reconnects uint64
	Queued     uint64
}

// cmdOffsets lists the offsets of cmdABI's fields in declaration order, for
// the comparison with the C layout.
func cmdOffsets() []uintptr {
	var c cmdABI
	return []uintptr{
		unsafe.Offsetof(c.Version), unsafe.Offsetof(c.Op), unsafe.Offsetof(c.Conn),
		unsafe.Offsetof(c.CallID), unsafe.Offsetof(c.TimeoutMS), unsafe.Offsetof(c.NHdrs),
		unsafe.Offsetof(c.Method), unsafe.Offsetof(c.MethodLen),
		unsafe.Offsetof(c.Body), unsafe.Offsetof(c.BodyLen),
		unsafe.Offsetof(c.Hdrs), unsafe.Offsetof(c.HdrsLen),
		unsafe.Offsetof(c.Addr), unsafe.Offsetof(c.AddrLen),
		unsafe.Offsetof(c.ServerName), unsafe.Offsetof(c.ServerNameLen),
		unsafe.Offsetof(c.CA), unsafe.Offsetof(c.CALen),
		unsafe.Offsetof(c.Cert), unsafe.Offsetof(c.CertLen),
		unsafe.Offsetof(c.Key), unsafe.Offsetof(c.KeyLen),
		unsafe.Offsetof(c.Pins), unsafe.Offsetof(c.PinsLen),
		unsafe.Offsetof(c.Insecure), unsafe.Offsetof(c.Conns), unsafe.Offsetof(c.Streams),
		unsafe.Offsetof(c.IdleTimeoutMS), unsafe.Offsetof(c.MaxFrameSize), unsafe.Offsetof(c.Reserved),
	}
}

func completionOffsets() []uintptr {
	var c completionABI
	return []uintptr{
		unsafe.Offsetof(c.CallID), unsafe.Offsetof(c.Handle), unsafe.Offsetof(c.Status),
		unsafe.Offsetof(c.Code), unsafe.Offsetof(c.Data), unsafe.Offsetof(c.Len),
	}
}

func statsOffsets() []uintptr {
	var s statsABI
	return []uintptr{
		unsafe.Offsetof(s.Inflight), unsafe.Offsetof(s.Calls), unsafe.Offsetof(s.Events),
		unsafe.Offsetof(s.Dropped), unsafe.Offsetof(s.Reconnects), unsafe.Offsetof(s.Queued),
	}
}
