package bridge

import "unsafe"

// Go mirrors of the C types in internal/hostq/qrpc.h. internal/hostq checks at
// start-up that every size, offset and constant equals the C compiler's,
// so a drift between Go and qrpc.h disables the library instead of
// corrupting memory.

// CmdABI is qrpc_cmd_t.
type CmdABI struct {
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
	Retries       int32
	// Version 2.
	HashKey     unsafe.Pointer
	HashKeyLen  uintptr
	ReqType     unsafe.Pointer
	ReqTypeLen  uintptr
	RespType    unsafe.Pointer
	RespTypeLen uintptr
	Flags       uint32
	VM          uint32
	Opts        unsafe.Pointer
	OptsLen     uintptr
}

// decodeCmd views a qrpc_cmd_t as a Command without copying, after
// checking that every (pointer, length) pair can be real; Runtime.Submit
// checks the rest.
func DecodeCmd(c *CmdABI, cmd *Command) error {
	if c == nil {
		return Badf("NULL command")
	}
	if c.Version != CmdVersion {
		return Badf("version %d, this library speaks %d", c.Version, CmdVersion)
	}
	if c.VM >= MaxVMs {
		return Badf("vm must be below %d, got %d", MaxVMs, c.VM)
	}
	// Cleared in place, then filled: a composite literal assigned through
	// the pointer is built on the stack and copied (a third of this
	// function's time on an echo answered inside a Go export).
	*cmd = Command{}
	cmd.Op, cmd.Conn, cmd.CallID, cmd.TimeoutMS, cmd.NHdrs = c.Op, c.Conn, c.CallID, c.TimeoutMS, c.NHdrs
	cmd.Retries, cmd.Flags, cmd.VM = c.Retries, c.Flags, c.VM
	// A closure rather than a table of field pointers: this runs for every
	// call and must not allocate.
	var err error
	view := func(p unsafe.Pointer, n uintptr, what string) []byte {
		if err != nil {
			return nil
		}
		var b []byte
		b, err = View(p, n, what)
		return b
	}
	cmd.Method = view(c.Method, c.MethodLen, "method")
	cmd.Body = view(c.Body, c.BodyLen, "body")
	cmd.Hdrs = view(c.Hdrs, c.HdrsLen, "headers")
	cmd.HashKey = view(c.HashKey, c.HashKeyLen, "hash_key")
	cmd.ReqType = view(c.ReqType, c.ReqTypeLen, "req_type")
	cmd.RespType = view(c.RespType, c.RespTypeLen, "resp_type")
	cmd.Opts = view(c.Opts, c.OptsLen, "opts")
	if c.Op == OpConnect {
		cmd.Addr = view(c.Addr, c.AddrLen, "addr")
		cmd.ServerName = view(c.ServerName, c.ServerNameLen, "server_name")
		cmd.CA = view(c.CA, c.CALen, "ca")
		cmd.Cert = view(c.Cert, c.CertLen, "cert")
		cmd.Key = view(c.Key, c.KeyLen, "key")
		cmd.Pins = view(c.Pins, c.PinsLen, "pins")
		cmd.Insecure = c.Insecure != 0
		cmd.Conns, cmd.Streams = c.Conns, c.Streams
		cmd.IdleTimeoutMS, cmd.MaxFrameSize = c.IdleTimeoutMS, c.MaxFrameSize
	}
	return err
}

// CmdOffsets lists the offsets of CmdABI's fields in declaration order, for
// the comparison with the C layout.
func CmdOffsets() []uintptr {
	var c CmdABI
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
		unsafe.Offsetof(c.IdleTimeoutMS), unsafe.Offsetof(c.MaxFrameSize), unsafe.Offsetof(c.Retries),
		unsafe.Offsetof(c.HashKey), unsafe.Offsetof(c.HashKeyLen),
		unsafe.Offsetof(c.ReqType), unsafe.Offsetof(c.ReqTypeLen),
		unsafe.Offsetof(c.RespType), unsafe.Offsetof(c.RespTypeLen),
		unsafe.Offsetof(c.Flags), unsafe.Offsetof(c.VM), unsafe.Offsetof(c.Opts), unsafe.Offsetof(c.OptsLen),
	}
}

// CompletionOffsets and StatsOffsets: the same for Completion
// (qrpc_completion_t) and Stats (qrpc_stats_t).
func CompletionOffsets() []uintptr {
	var c Completion
	return []uintptr{
		unsafe.Offsetof(c.CallID), unsafe.Offsetof(c.Handle), unsafe.Offsetof(c.Status),
		unsafe.Offsetof(c.Code), unsafe.Offsetof(c.Data), unsafe.Offsetof(c.Len),
	}
}

func StatsOffsets() []uintptr {
	var s Stats
	return []uintptr{
		unsafe.Offsetof(s.Inflight), unsafe.Offsetof(s.Calls), unsafe.Offsetof(s.Events),
		unsafe.Offsetof(s.Dropped), unsafe.Offsetof(s.Reconnects), unsafe.Offsetof(s.Queued),
	}
}
