package bridge

import (
	"context"
	"errors"
	"strconv"
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
	opUnused             // 7: no op; the ops after it keep qrpc.h's numbers

	// Query ops (qrpc_query): answered synchronously by a registered
	// QueryFunc.
	OpPeers         // conn -> the peers of that pool
	OpMetrics       // this worker's metrics
	OpProtoLoad     // load protobuf definitions
	OpConfigure     // runtime settings
	OpProfile       // a pprof profile of this worker's Go runtime
	OpProtoDescribe // services, HTTP rules and messages of a .proto file
	OpPoolShare     // conn, opts = verdicts in -> this view's verdicts (share.go)

	// lastSubmitOp is the highest op of Submit (qrpc_submit_async, the
	// synchronous EVENT and CLOSE of qrpc_query, lua-resty-ffi).
	lastSubmitOp = OpEcho
	lastOp       = OpPoolShare
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
// reads and of the result blobs and error messages it writes.
const CmdVersion = 5

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
	st, head, detail := statusWords(err)
	// A pool call that made several attempts (or whose retry the budget
	// refused) says so in fields of its own, never in the error string.
	var ae *qrpc.AttemptsError
	attempts, budget := 0, false
	if st != ErrBadArg && errors.As(err, &ae) {
		attempts, budget = ae.Attempts, ae.Budget
	}
	return st, EncodeMessage(head, detail, attempts, budget)
}

// MsgSep separates the fields of an error message that crosses to Lua:
//
//	err [ MsgSep detail MsgSep attempts MsgSep budget ]
//
// err is what the caller compares ("timeout", "connect: refused",
// "bad config: ..."); detail the library's own text, attempts a pool
// call's count (0: not said), budget "1" when the retry budget refused a
// retry. A message with no detail, no attempts and no budget is err alone,
// so the common words cross as they read.
const MsgSep = "\x1f"

// maxDetail bounds the detail field (the whole message stays within the
// hosts' 512-byte error buffers: err <= maxMsgLen, detail <= maxDetail).
const maxDetail = 200

// EncodeMessage builds the message of an error for Lua (see MsgSep).
func EncodeMessage(head, detail string, attempts int, budget bool) string {
	head = strings.ReplaceAll(Clip(head), MsgSep, " ")
	if detail == "" && attempts <= 0 && !budget {
		return head
	}
	detail = strings.ReplaceAll(detail, MsgSep, " ")
	if len(detail) > maxDetail {
		detail = detail[:maxDetail-3] + "..."
	}
	b := "0"
	if budget {
		b = "1"
	}
	return head + MsgSep + detail + MsgSep + strconv.Itoa(max(attempts, 0)) + MsgSep + b
}

// DecodeMessage splits a message built by EncodeMessage (for tests and
// the C test host).
func DecodeMessage(msg string) (head, detail string, attempts int, budget bool) {
	f := strings.Split(msg, MsgSep)
	head = f[0]
	if len(f) == 4 {
		detail = f[1]
		attempts, _ = strconv.Atoi(f[2])
		budget = f[3] == "1"
	}
	return
}

// statusWords: the status, what the caller compares (the word, and the
// reason from the fixed list: qrpc.Classify), and the detail.
func statusWords(err error) (int32, string, string) {
	var de *qrpc.DialError
	switch {
	case errors.Is(err, ErrBadCommand):
		return ErrBadArg, Clip(err.Error()), ""
	case errors.Is(err, qrpc.ErrTimeout):
		return ErrTimeout, "timeout", ""
	case errors.Is(err, qrpc.ErrClosed), errors.Is(err, context.Canceled):
		return ErrClosed, "closed", ""
	case errors.Is(err, qrpc.ErrQueueFull):
		return ErrFull, "queue full", ""
	case errors.Is(err, qrpc.ErrInternal):
		// what panicked is the detail (the log has the stack)
		return ErrGeneric, qrpc.WordInternal, qrpc.Classify(err).Detail
	case errors.Is(err, qrpc.ErrUnavailable):
		// Checked before DialError: "unavailable" wraps the last dial
		// failure's text, and the call did not try to dial.
		h, d := reasonFields(err)
		return ErrUnavail, h, d
	case errors.As(err, &de):
		// connect: the reason says it all; the dial's own text (address,
		// quic-go's words) goes to error.log with the failure
		h, _ := reasonFields(de)
		return ErrConnect, h, ""
	case errors.Is(err, qrpc.ErrConnLost):
		h, d := reasonFields(err)
		return ErrLost, h, d
	case errors.Is(err, qrpc.ErrTooLarge):
		h, d := reasonFields(err)
		return ErrTooBig, h, d
	case errors.Is(err, qrpc.ErrBadConfig):
		return ErrBadArg, prefixed("bad config", qrpc.ErrBadConfig, err), ""
	case errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout, "timeout", ""
	}
	return ErrGeneric, Clip(strings.TrimPrefix(err.Error(), "qrpc: ")), ""
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
