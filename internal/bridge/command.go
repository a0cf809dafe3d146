package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
)

// Limits on what a command may carry. They only reject nonsense (a length
// that cannot be real); the frame limit of the connection is enforced by
// qrpc when the request is encoded.
const (
	maxFieldLen = 1<<31 - 1
	maxHeaders  = limits.HeaderEntries // keys + values
	maxConns    = limits.Conns
	maxStreams  = limits.Streams
	maxRetries  = limits.Retries
	maxTypeName = limits.TypeName // req_type, resp_type: protobuf full names
	maxHashKey  = limits.HashKey
	maxOpts     = 1 << 20 // "key=value\n" lines
)

// ErrBadCommand marks a malformed command (QRPC_ERR_BADARG): a bug in the
// caller, never a condition of the network.
var ErrBadCommand = errors.New("bad command")

// Badf returns an ErrBadCommand with a reason.
func Badf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadCommand}, args...)...)
}

// Command is a decoded qrpc_cmd_t. Its byte slices alias the caller's
// memory (no copy): they are valid only while the command is being
// accepted, see qrpc.h.
type Command struct {
	Op        uint32
	VM        uint32 // the built-in host's Lua VM (qrpc_vm_open)
	Conn      uint64
	CallID    uint64
	TimeoutMS int32
	NHdrs     uint32

	Method, Body, Hdrs []byte

	// CONNECT only.
	Addr, ServerName, CA, Cert, Key, Pins []byte
	Insecure                              bool
	Conns, Streams                        int32
	IdleTimeoutMS, MaxFrameSize           int32

	// Version 2.
	Retries                    int32
	HashKey, ReqType, RespType []byte
	Flags                      uint32
	Opts                       []byte
}

// View returns the n bytes at p without copying, after checking that the
// pair can be real.
func View(p unsafe.Pointer, n uintptr, what string) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, Badf("%s: NULL pointer with length %d", what, n)
	}
	if n > maxFieldLen {
		return nil, Badf("%s: length %d out of range", what, n)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// Check validates everything that does not need the connection table, so
// that the ops only look up handles.
func (c *Command) Check() error {
	if c.Op < OpConnect || c.Op > lastOp || c.Op == opUnused {
		return Badf("unknown op %d", c.Op)
	}
	if c.TimeoutMS < 0 {
		return Badf("negative timeout %d ms", c.TimeoutMS)
	}
	if c.NHdrs > maxHeaders {
		return Badf("%d header entries, at most %d", c.NHdrs, maxHeaders)
	}
	if c.NHdrs%2 != 0 {
		return Badf("odd number of header entries (%d): keys and values alternate", c.NHdrs)
	}
	if err := c.checkV2(); err != nil {
		return err
	}
	switch c.Op {
	case OpUnary, OpEvent:
		if len(c.Method) == 0 {
			return Badf("empty method")
		}
		if c.Conn == 0 {
			return Badf("no connection handle")
		}
	case OpClose:
		if c.Conn == 0 {
			return Badf("no connection handle")
		}
	case OpConnect:
		switch {
		case len(c.Addr) == 0 && len(c.Opts) == 0:
			// With opts, addr= lines may give the addresses.
			return Badf("empty address")
		case len(c.Pins)%32 != 0:
			return Badf("pins: %d bytes is not a multiple of 32 (raw SHA-256 digests)", len(c.Pins))
		case c.Conns < 0 || c.Conns > maxConns:
			return Badf("conns must be 0..%d, got %d", maxConns, c.Conns)
		case c.Streams < 0 || c.Streams > maxStreams:
			return Badf("streams must be 0..%d, got %d", maxStreams, c.Streams)
		case c.IdleTimeoutMS < 0:
			return Badf("negative idle timeout %d ms", c.IdleTimeoutMS)
		case c.MaxFrameSize < 0 || (c.MaxFrameSize > 0 && c.MaxFrameSize < 64):
			return Badf("max frame size must be 0 (default) or 64..1 GiB, got %d", c.MaxFrameSize)
		case (len(c.Cert) == 0) != (len(c.Key) == 0):
			return Badf("cert and key go together")
		}
	}
	return nil
}

// checkV2 validates the fields version 2 added: their sizes and the ops
// they belong to. A field set on an op that does not read it is refused
// rather than ignored, so that a caller's mistake does not pass silently.
func (c *Command) checkV2() error {
	unaryOrEvent := c.Op == OpUnary || c.Op == OpEvent
	switch {
	case c.Flags&^(FlagDiscardUnknown|FlagProtoNames|FlagLuaTable|FlagLuaRequest|FlagEmitUnpopulated) != 0:
		return Badf("unknown flags 0x%x", c.Flags&^(FlagDiscardUnknown|FlagProtoNames|FlagLuaTable|FlagLuaRequest|FlagEmitUnpopulated))
	case c.Retries < 0 || c.Retries > maxRetries:
		return Badf("retries must be 0..%d, got %d", maxRetries, c.Retries)
	case c.Retries != 0 && c.Op != OpUnary:
		return Badf("retries: only for UNARY")
	case len(c.HashKey) > maxHashKey:
		return Badf("hash_key: %d bytes, at most %d", len(c.HashKey), maxHashKey)
	case len(c.HashKey) > 0 && !unaryOrEvent:
		return Badf("hash_key: only for UNARY and EVENT")
	case len(c.ReqType) > maxTypeName:
		return Badf("req_type: %d bytes, at most %d", len(c.ReqType), maxTypeName)
	case len(c.ReqType) > 0 && !unaryOrEvent:
		return Badf("req_type: only for UNARY and EVENT")
	case len(c.RespType) > maxTypeName:
		return Badf("resp_type: %d bytes, at most %d", len(c.RespType), maxTypeName)
	case len(c.RespType) > 0 && c.Op != OpUnary:
		return Badf("resp_type: only for UNARY")
	case len(c.Opts) > maxOpts:
		return Badf("opts: %d bytes, at most %d", len(c.Opts), maxOpts)
	}
	return unsupported(c)
}

// unsupported refuses the version 2 fields whose features have not landed
// yet: ignoring them would, for example, send a JSON body the caller asked
// to have encoded. Each feature removes its line when it reads its field.
func unsupported(c *Command) error {
	switch {
	case len(c.Opts) != 0 && c.Op <= lastSubmitOp && c.Op != OpConnect && c.Op != OpUnary:
		return Badf("opts: not supported by this library yet")
	}
	return nil
}

// ParseHeaders splits a packed header block ([u32 len][bytes] per entry,
// n entries) into dst, without copying. The entries alias block.
func ParseHeaders(block []byte, n uint32, dst [][]byte) ([][]byte, error) {
	for i := uint32(0); i < n; i++ {
		if len(block) < 4 {
			return dst, Badf("headers: entry %d truncated", i)
		}
		l := binary.NativeEndian.Uint32(block)
		block = block[4:]
		if uint64(l) > uint64(len(block)) {
			return dst, Badf("headers: entry %d says %d bytes, %d left", i, l, len(block))
		}
		dst = append(dst, block[:l:l])
		block = block[l:]
	}
	if len(block) != 0 {
		return dst, Badf("headers: %d bytes after the %d entries", len(block), n)
	}
	return dst, nil
}

// headersSize is the size of the packed block for hdrs.
func headersSize(hdrs [][]byte) int {
	n := 0
	for _, h := range hdrs {
		n += 4 + len(h)
	}
	return n
}

// ResultHead is QRPC_RESULT_HEAD, the bytes of a result blob before its
// headers block: code, hdrs_len, attempts.
const ResultHead = 12

// ResultSize is the size of a result blob.
func ResultSize(hdrs [][]byte, body []byte) int {
	return ResultHead + headersSize(hdrs) + len(body)
}

// WriteResult fills dst (exactly ResultSize bytes) with the result blob
// [u32 code][u32 hdrs_len][u32 attempts][hdrs block][body]; attempts is
// 1 until SetAttempts writes a unary's count.
func WriteResult(dst []byte, code uint32, hdrs [][]byte, body []byte) {
	ne := binary.NativeEndian
	ne.PutUint32(dst, code)
	ne.PutUint32(dst[4:], uint32(headersSize(hdrs)))
	ne.PutUint32(dst[8:], 1)
	copy(dst[ResultHead+writeHeaders(dst[ResultHead:], hdrs):], body)
}

// SetAttempts writes a unary's attempt count into the result blob its
// completion carries: a StatusOK one's, or the one after a
// StatusBadResponse's message. The count is known only once the pool
// delivers the call, after whichever path built the blob; other
// completions are left as they are.
func SetAttempts(c Completion, attempts int) {
	if c.Data == nil {
		return
	}
	b := Bytes(c.Data, int(c.Len))
	switch c.Status {
	case StatusOK:
	case StatusBadResponse:
		if len(b) < 4 || uint64(binary.NativeEndian.Uint32(b)) > uint64(len(b)-4) {
			return
		}
		b = b[4+binary.NativeEndian.Uint32(b):]
	default:
		return
	}
	if len(b) >= ResultHead {
		binary.NativeEndian.PutUint32(b[8:], uint32(attempts))
	}
}

// ResultAttempts is the attempt count of a result blob (0 if it is too
// short to hold one).
func ResultAttempts(b []byte) uint32 {
	if len(b) < ResultHead {
		return 0
	}
	return binary.NativeEndian.Uint32(b[8:])
}

// writeHeaders packs hdrs at the start of dst; it returns the length.
func writeHeaders(dst []byte, hdrs [][]byte) int {
	n := 0
	for _, h := range hdrs {
		binary.NativeEndian.PutUint32(dst[n:], uint32(len(h)))
		n += 4 + copy(dst[n+4:], h)
	}
	return n
}

// PackHeaders builds the packed header block of qrpc.h from alternating
// keys and values (the Lua module's job; tests and Go callers use this).
func PackHeaders(kv ...string) []byte {
	hdrs := make([][]byte, len(kv))
	for i, s := range kv {
		hdrs[i] = []byte(s)
	}
	b := make([]byte, headersSize(hdrs))
	writeHeaders(b, hdrs)
	return b
}

// ParseResult splits a result blob; the parts alias b.
func ParseResult(b []byte) (code uint32, hdrs [][]byte, body []byte, err error) {
	if len(b) < ResultHead {
		return 0, nil, nil, fmt.Errorf("result blob of %d bytes", len(b))
	}
	code = binary.NativeEndian.Uint32(b)
	hl := binary.NativeEndian.Uint32(b[4:])
	if uint64(hl) > uint64(len(b)-ResultHead) {
		return 0, nil, nil, fmt.Errorf("hdrs_len %d in a blob of %d bytes", hl, len(b))
	}
	block := b[ResultHead : ResultHead+hl]
	for len(block) > 0 {
		if len(block) < 4 || uint64(binary.NativeEndian.Uint32(block)) > uint64(len(block)-4) {
			return 0, nil, nil, fmt.Errorf("headers block truncated")
		}
		n := binary.NativeEndian.Uint32(block)
		hdrs = append(hdrs, block[4:4+n:4+n])
		block = block[4+n:]
	}
	return code, hdrs, b[ResultHead+hl:], nil
}
