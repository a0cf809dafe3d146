package main

import (
	"context"
	"errors"
	"strings"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// maxMsgLen bounds error messages handed to Lua: they end up in logs and
// HTTP answers, and a wrapped quic-go error can be long.
const maxMsgLen = 256

// statusOf maps an error to a status code and the short message Lua sees.
// Messages never contain request or response bodies: qrpc's errors carry
// addresses and reasons only, and nothing here adds payload.
func statusOf(err error) (int32, string) {
	var de *qrpc.DialError
	switch {
	case err == nil:
		return statusOK, ""
	case errors.Is(err, errBadCommand):
		return errBadArg, clip(err.Error())
	case errors.Is(err, qrpc.ErrTimeout):
		return errTimeout, "timeout"
	case errors.Is(err, qrpc.ErrClosed), errors.Is(err, context.Canceled):
		return errClosed, "closed"
	case errors.Is(err, qrpc.ErrQueueFull):
		return errFull, "queue full"
	case errors.Is(err, qrpc.ErrUnavailable):
		// Checked before DialError: "unavailable" wraps the last dial
		// failure's text, and the call did not try to dial.
		return errUnavail, prefixed("unavailable", qrpc.ErrUnavailable, err)
	case errors.As(err, &de):
		return errConnect, clip("connect: " + de.Reason)
	case errors.Is(err, qrpc.ErrConnLost):
		return errLost, prefixed("connection lost", qrpc.ErrConnLost, err)
	case errors.Is(err, qrpc.ErrTooLarge):
		return errTooBig, prefixed("too large", qrpc.ErrTooLarge, err)
	case errors.Is(err, qrpc.ErrBadConfig):
		return errBadArg, prefixed("bad config", qrpc.ErrBadConfig, err)
	case errors.Is(err, context.DeadlineExceeded):
		return errTimeout, "timeout"
	}
	return errGeneric, clip(strings.TrimPrefix(err.Error(), "qrpc: "))
}

// prefixed renders err as "<kind>: <detail>", dropping the sentinel's own
// text ("qrpc: message too large") that wrapping put in front.
func prefixed(kind string, sentinel, err error) string {
	msg := strings.TrimPrefix(err.Error(), sentinel.Error())
	msg = strings.TrimPrefix(msg, ": ")
	if msg == "" {
		return kind
	}
	return clip(kind + ": " + msg)
}

func clip(s string) string {
	if len(s) <= maxMsgLen {
		return s
	}
	return s[:maxMsgLen-3] + "..."
}
