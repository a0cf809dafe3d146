package qrpc

import (
	"errors"
	"fmt"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
)

// Sentinel errors. Errors returned by this package wrap one of these (or a
// context error) so callers can match with errors.Is; the message adds the
// detail.
var (
	// ErrClosed: the client (or server) was closed; pending calls fail with it.
	ErrClosed = errors.New("qrpc: closed")
	// ErrTimeout: the call's deadline passed before the response came.
	ErrTimeout = errors.New("qrpc: timeout")
	// ErrUnavailable: no live connection right now; the client is re-dialling
	// in the background.
	ErrUnavailable = errors.New("qrpc: unavailable")
	// ErrConnLost: the connection died while the call was in flight.
	ErrConnLost = errors.New("qrpc: connection lost")
	// ErrProtocol: the peer sent something that is not qrpc.
	ErrProtocol = errors.New("qrpc: protocol error")
	// ErrDial: connecting or the TLS handshake failed.
	ErrDial = errors.New("qrpc: connect")
	// ErrTooLarge: the request does not fit in one frame.
	ErrTooLarge = errors.New("qrpc: message too large")
	// ErrBadConfig: a Config field is invalid.
	ErrBadConfig = errors.New("qrpc: bad config")
	// ErrInternal: a goroutine of the client panicked while it held the
	// call (a bug); the panic was recovered and reported (internal/safego).
	ErrInternal = errors.New("qrpc: internal error")
)

// Frame decoding errors, re-exported for errors.Is.
var (
	ErrFrameTooLarge = frame.ErrFrameTooLarge
	ErrUnknownFlag   = frame.ErrUnknownFlag
)

// Response codes this package itself puts in responses. Applications own the
// rest of the space; 0 means success.
const (
	// CodeUnknownMethod answers a request for a method with no handler.
	CodeUnknownMethod uint32 = 12
	// CodeInternal answers a request whose handler panicked.
	CodeInternal uint32 = 13
)

// DialError is a failed connection attempt. Reason is one short phrase that
// tells the kinds of failure apart ("certificate signed by unknown
// authority", "certificate is for another host", "certificate expired",
// "no application protocol", "timeout", "refused", ...).
type DialError struct {
	Addr   string
	Reason string
	Err    error
}

func (e *DialError) Error() string {
	return fmt.Sprintf("connect %s: %s: %v", e.Addr, e.Reason, e.Err)
}

func (e *DialError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrDial) true for every DialError.
func (e *DialError) Is(target error) bool { return target == ErrDial }
