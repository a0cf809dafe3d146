package bridge

import (
	"context"
	"errors"
	"strings"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Operation codes (qrpc_cmd_t.op). ffi/ checks at start-up that they equal
// qrpc.h's QRPC_OP_*.
const (
	OpConnect = iota + 1 // dial; completes with a connection handle
	OpUnary              // request/response; completes with a result blob
	OpEvent              // one-way; done at once
	OpClose              // close a connection; done at once
	OpCancel             // forget call_id; done at once
	OpEcho               // completes with the body, no network (IPC benchmark)
	OpStats              // completes with a qrpc_stats_t in a result blob

	// Query ops (qrpc_query): answered synchronously by a registered
	// QueryFunc.
	OpPeers         // conn -> the peers of that pool
	OpMetrics       // this worker's metrics
	OpProtoLoad     // load protobuf definitions
	OpConfigure     // runtime settings
	OpProfile       // a pprof profile of this worker's Go runtime
	OpProtoDescribe // services, HTTP rules and messages of a .proto file

	// lastSubmitOp is the highest op of Submit (qrpc_submit_async, the
	// synchronous EVENT and CLOSE of qrpc_query, lua-resty-ffi).
	lastSubmitOp = OpStats
	lastOp       = OpProtoDescribe
)

// FlagDiscardUnknown is QRPC_F_DISCARD_UNKNOWN: req_type's JSON may carry
// fields the message does not have.
const FlagDiscardUnknown = 1

// Status codes (QRPC_OK, QRPC_ERR_*): the value of every export and
// completion. Negative values are errors.
const (
	StatusOK      int32 = iota // done
	StatusPending              // accepted: a completion will follow
	StatusLog                  // a completion carrying a log line
)

const (
	ErrGeneric int32 = -(iota + 1) // anything else; the message says what
	ErrTimeout                     // "timeout"
	ErrClosed                      // "closed": connection or host closed
	ErrFull                        // "queue full"
	ErrBadArg                      // malformed command or configuration
	ErrConnect                     // "connect: <reason>"
	ErrUnavail                     // "unavailable: <reason>" (re-dialling)
	ErrTooBig                      // "too large: ..."
	ErrLost                        // "connection lost: ..." while in flight
)

// CmdVersion is QRPC_CMD_VERSION: the layout of qrpc_cmd_t this runtime
// reads and of the result blobs it writes.
const CmdVersion = 3

// MaxVMs is QRPC_MAX_VMS: how many Lua VMs (one per nginx subsystem) one
// process's built-in host serves; qrpc_cmd_t.vm is below it.
const MaxVMs = 8

// maxMsgLen bounds error messages handed to Lua: they end up in logs and
// HTTP answers, and a wrapped quic-go error can be long.
const maxMsgLen = 256

// StatusOf maps an error to a status code and the short message Lua sees.
// Messages never contain request or response bodies: qrpc's errors carry
// addresses and reasons only, and nothing here adds payload.
func StatusOf(err error) (int32, string) {
	if err == nil {
		// Before de exists: errors.As makes it escape, and every
		// successful submit would allocate it.
		return StatusOK, ""
	}
	return statusOfErr(err)
}

func statusOfErr(err error) (int32, string) {
	st, msg := statusWords(err)
	// A pool call that made several attempts says how many (and whether
	// the retry budget stopped it) after its last error's words.
	var ae *qrpc.AttemptsError
	if st != ErrBadArg && errors.As(err, &ae) {
		msg = Clip(msg + ae.Suffix())
	}
	return st, msg
}

func statusWords(err error) (int32, string) {
	var de *qrpc.DialError
	switch {
	case errors.Is(err, ErrBadCommand):
		return ErrBadArg, Clip(err.Error())
	case errors.Is(err, qrpc.ErrTimeout):
		return ErrTimeout, "timeout"
	case errors.Is(err, qrpc.ErrClosed), errors.Is(err, context.Canceled):
		return ErrClosed, "closed"
	case errors.Is(err, qrpc.ErrQueueFull):
		return ErrFull, "queue full"
	case errors.Is(err, qrpc.ErrUnavailable):
		// Checked before DialError: "unavailable" wraps the last dial
		// failure's text, and the call did not try to dial.
		return ErrUnavail, reasonMessage(err)
	case errors.As(err, &de):
		return ErrConnect, reasonMessage(de)
	case errors.Is(err, qrpc.ErrConnLost):
		return ErrLost, reasonMessage(err)
	case errors.Is(err, qrpc.ErrTooLarge):
		return ErrTooBig, reasonMessage(err)
	case errors.Is(err, qrpc.ErrBadConfig):
		return ErrBadArg, prefixed("bad config", qrpc.ErrBadConfig, err)
	case errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout, "timeout"
	}
	return ErrGeneric, Clip(strings.TrimPrefix(err.Error(), "qrpc: "))
}

// prefixed renders err as "<kind>: <detail>", dropping the sentinel's own
// text ("qrpc: message too large") that wrapping put in front.
func prefixed(kind string, sentinel, err error) string {
	msg := strings.TrimPrefix(err.Error(), sentinel.Error())
	msg = strings.TrimPrefix(msg, ": ")
	if msg == "" {
		return kind
	}
	return Clip(kind + ": " + msg)
}

// Clip shortens a message to what a host passes on.
func Clip(s string) string {
	if len(s) <= maxMsgLen {
		return s
	}
	return s[:maxMsgLen-3] + "..."
}
