package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Limits on what a command may carry. They only reject nonsense (a length
// that cannot be real); the frame limit of the connection is enforced by
// qrpc when the request is encoded.
const (
	maxFieldLen = 1<<31 - 1
	maxHeaders  = 1 << 16 // entries (keys + values)
	maxConns    = 64
	maxStreams  = 1024
)

// errBadCommand marks a malformed command (QRPC_ERR_BADARG).
var errBadCommand = errors.New("bad command")

func badf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errBadCommand}, args...)...)
}

// command is a decoded qrpc_cmd_t. Its byte slices alias the caller's
// memory (no copy): they are valid only while the command is being
// accepted, see qrpc.h.
type command struct {
	op        uint32
	conn      uint64
	callID    uint64
	timeoutMS int32
	nhdrs     uint32

	method, body, hdrs []byte

	// CONNECT only.
	addr, serverName, ca, cert, key, pins []byte
	insecure                              bool
	conns, streams                        int32
	idleTimeoutMS, maxFrameSize           int32
}

// cbytes views n bytes at p without copying.
func cbytes(p unsafe.Pointer, n uintptr, what string) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, badf("%s: NULL pointer with length %d", what, n)
	}
	if n > maxFieldLen {
		return nil, badf("%s: length %d out of range", what, n)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// decodeCmd checks and views a qrpc_cmd_t. It validates everything that
// does not need the connection table, so that the ops only look up handles.
func decodeCmd(c *cmdABI) (command, error) {
	var cmd command
	if c == nil {
		return cmd, badf("NULL command")
	}
	if c.Version != cmdVersion {
		return cmd, badf("version %d, this library speaks %d", c.Version, cmdVersion)
	}
	if c.Op < opConnect || c.Op > opStats {
		return cmd, badf("unknown op %d", c.Op)
	}
	cmd.op, cmd.conn, cmd.callID, cmd.timeoutMS, cmd.nhdrs = c.Op, c.Conn, c.CallID, c.TimeoutMS, c.NHdrs
	if c.TimeoutMS < 0 {
		return cmd, badf("negative timeout %d ms", c.TimeoutMS)
	}
	// A closure rather than a table of field pointers: this runs for every
	// call and must not allocate.
	var err error
	view := func(p unsafe.Pointer, n uintptr, what string) []byte {
		if err != nil {
			return nil
		}
		var b []byte
		b, err = cbytes(p, n, what)
		return b
	}
	cmd.method = view(c.Method, c.MethodLen, "method")
	cmd.body = view(c.Body, c.BodyLen, "body")
	cmd.hdrs = view(c.Hdrs, c.HdrsLen, "headers")
	if c.Op == opConnect {
		cmd.addr = view(c.Addr, c.AddrLen, "addr")
		cmd.serverName = view(c.ServerName, c.ServerNameLen, "server_name")
		cmd.ca = view(c.CA, c.CALen, "ca")
		cmd.cert = view(c.Cert, c.CertLen, "cert")
		cmd.key = view(c.Key, c.KeyLen, "key")
		cmd.pins = view(c.Pins, c.PinsLen, "pins")
	}
	if err != nil {
		return cmd, err
	}
	if c.NHdrs > maxHeaders {
		return cmd, badf("%d header entries, at most %d", c.NHdrs, maxHeaders)
	}
	if c.NHdrs%2 != 0 {
		return cmd, badf("odd number of header entries (%d): keys and values alternate", c.NHdrs)
	}
	switch c.Op {
	case opUnary, opEvent:
		if len(cmd.method) == 0 {
			return cmd, badf("empty method")
		}
		if c.Conn == 0 {
			return cmd, badf("no connection handle")
		}
	case opClose, opStats:
		if c.Op == opClose && c.Conn == 0 {
			return cmd, badf("no connection handle")
		}
	case opConnect:
		cmd.insecure = c.Insecure != 0
		cmd.conns, cmd.streams = c.Conns, c.Streams
		cmd.idleTimeoutMS, cmd.maxFrameSize = c.IdleTimeoutMS, c.MaxFrameSize
		switch {
		case len(cmd.addr) == 0:
			return cmd, badf("empty address")
		case len(cmd.pins)%32 != 0:
			return cmd, badf("pins: %d bytes is not a multiple of 32 (raw SHA-256 digests)", len(cmd.pins))
		case c.Conns < 0 || c.Conns > maxConns:
			return cmd, badf("conns must be 0..%d, got %d", maxConns, c.Conns)
		case c.Streams < 0 || c.Streams > maxStreams:
			return cmd, badf("streams must be 0..%d, got %d", maxStreams, c.Streams)
		case c.IdleTimeoutMS < 0:
			return cmd, badf("negative idle timeout %d ms", c.IdleTimeoutMS)
		case c.MaxFrameSize < 0 || (c.MaxFrameSize > 0 && c.MaxFrameSize < 64):
			return cmd, badf("max frame size must be 0 (default) or 64..1 GiB, got %d", c.MaxFrameSize)
		case (len(cmd.cert) == 0) != (len(cmd.key) == 0):
			return cmd, badf("cert and key go together")
		}
	}
	return cmd, nil
}

// parseHeaders splits a packed header block ([u32 len][bytes] per entry,
// n entries) into dst, without copying. The entries alias block.
func parseHeaders(block []byte, n uint32, dst [][]byte) ([][]byte, error) {
	for i := uint32(0); i < n; i++ {
		if len(block) < 4 {
			return dst, badf("headers: entry %d truncated", i)
		}
		l := binary.NativeEndian.Uint32(block)
		block = block[4:]
		if uint64(l) > uint64(len(block)) {
			return dst, badf("headers: entry %d says %d bytes, %d left", i, l, len(block))
		}
		dst = append(dst, block[:l:l])
		block = block[l:]
	}
	if len(block) != 0 {
		return dst, badf("headers: %d bytes after the %d entries", len(block), n)
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

// resultSize is the size of a result blob.
func resultSize(hdrs [][]byte, body []byte) int {
	return 8 + headersSize(hdrs) + len(body)
}

// writeResult fills dst (exactly resultSize bytes) with the result blob
// [u32 code][u32 hdrs_len][hdrs block][body].
func writeResult(dst []byte, code uint32, hdrs [][]byte, body []byte) {
	ne := binary.NativeEndian
	ne.PutUint32(dst, code)
	ne.PutUint32(dst[4:], uint32(headersSize(hdrs)))
	p := dst[8:]
	for _, h := range hdrs {
		ne.PutUint32(p, uint32(len(h)))
		p = p[4+copy(p[4:], h):]
	}
	copy(p, body)
}
