package qrpc

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
)

// MaxResponseHeaderEntries bounds the header entries (names and values)
// of an answer, as limits.HeaderEntries bounds a request's: turning more
// into a Lua table would block nginx's event loop, and a frame of empty
// entries costs 24 bytes of slice header per 2 bytes on the wire.
const MaxResponseHeaderEntries = limits.HeaderEntries

// keepHeaders is the largest header slice a stream's reader keeps for the
// next answer; a larger one (one unusual answer) is left to the GC rather
// than pinned for the connection's life.
const keepHeaders = 64

// checkResponseHeaders refuses an answer with more header entries than
// MaxResponseHeaderEntries before it is unmarshalled (which would allocate
// them). Each entry takes at least 2 bytes on the wire (tag and length),
// so a payload under twice the limit needs no count.
func checkResponseHeaders(payload []byte) error {
	if len(payload) < 2*MaxResponseHeaderEntries {
		return nil
	}
	n := 0
	for b := payload; len(b) > 0; {
		// A field that does not parse ends the answer here, as the
		// unmarshal would, but before it: the unmarshal would first
		// allocate every entry ahead of it.
		num, typ, tl := protowire.ConsumeTag(b)
		if tl < 0 {
			return fmt.Errorf("%w: bad response: %v", ErrProtocol, protowire.ParseError(tl))
		}
		vl := protowire.ConsumeFieldValue(num, typ, b[tl:])
		if vl < 0 {
			return fmt.Errorf("%w: bad response: %v", ErrProtocol, protowire.ParseError(vl))
		}
		if num == 1 {
			n++
		}
		b = b[tl+vl:]
	}
	if n > MaxResponseHeaderEntries {
		return fmt.Errorf("%w: answer with %d header entries, at most %d", ErrProtocol, n, MaxResponseHeaderEntries)
	}
	return nil
}

// evenHeaders drops a dangling name at the end of a flat header list:
// the reference server pairs entries two by two and a name without a
// value carries nothing, so the answer goes through without it (and a
// caller never sees a list it cannot pair).
func evenHeaders(h [][]byte) [][]byte {
	if len(h)%2 == 1 {
		return h[:len(h)-1]
	}
	return h
}
