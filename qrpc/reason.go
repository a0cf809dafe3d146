package qrpc

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/quic-go/quic-go"
)

// The first words of error strings, as callers see them. A dashboard or
// an alert matches on these and on the reason that follows; both come from
// fixed lists (Reasons), never from raw library text.
const (
	WordTimeout     = "timeout"         // the call's deadline passed
	WordClosed      = "closed"          // the client was closed (or the call cancelled)
	WordQueueFull   = "queue full"      // the stream's send queue is full; nothing was sent
	WordConnect     = "connect"         // dialling or the TLS handshake failed
	WordUnavailable = "unavailable"     // no live connection; the call was not sent
	WordConnLost    = "connection lost" // the connection died with the call in flight
	WordTooLarge    = "too large"       // the request does not fit in one frame
	WordBadConfig   = "bad config"      // an option was rejected (free text follows)
	WordInternal    = "internal error"  // a panic was recovered while the library held the call
	WordOther       = "qrpc"            // anything else (free text follows)
)

// Dial reasons (DialError.Reason): what went wrong connecting.
const (
	ReasonUnknownAuthority = "certificate signed by unknown authority"
	ReasonWrongHost        = "certificate is for another host"
	ReasonExpired          = "certificate expired or not yet valid"
	ReasonCertInvalid      = "certificate invalid"
	ReasonPinMismatch      = "certificate pin mismatch"
	ReasonTimeout          = "timeout"
	ReasonNoALPN           = "no application protocol (ALPN qrpc refused)"
	ReasonClientCertNeeded = "client certificate required by server"
	ReasonClientCertBad    = "client certificate rejected by server"
	ReasonTLSFailed        = "tls handshake failed"
	ReasonNoHost           = "cannot resolve host"
	ReasonUnreachable      = "cannot resolve or reach address"
	ReasonRefused          = "refused"
	ReasonDialFailed       = "failed"
)

// Reasons a live connection ends.
const (
	ReasonIdleTimeout    = "idle timeout"            // nothing heard from the server for idle_timeout
	ReasonStatelessReset = "stateless reset"         // the server lost the connection's state (restarted)
	ReasonServerClosed   = "closed by server"        // the server closed the connection
	ReasonLocalClosed    = "closed locally"          // this side closed it (after another failure)
	ReasonTransport      = "transport error"         // a QUIC protocol error
	ReasonStreamReset    = "stream reset"            // the server reset a stream
	ReasonStreamEOF      = "stream closed by server" // the server ended a stream
	ReasonProtocol       = "protocol error"          // the server sent something that is not qrpc
	ReasonLostOther      = "other"                   // none of the above; the detail says what
)

// Reasons of "unavailable" besides those of connect and connection lost
// (which say why the last connection or dial failed), and of "too large".
const (
	ReasonReconnecting = "reconnecting"                   // no failure recorded yet
	ReasonNoServer     = "no server up"                   // every server of a pool is ejected or connecting
	ReasonNoStream     = "no stream in service"           // every stream of the connection is being replaced
	ReasonFrameLimit   = "request exceeds max_frame_size" // the request's frame is over the limit
)

var (
	dialReasons = []string{
		ReasonUnknownAuthority, ReasonWrongHost, ReasonExpired, ReasonCertInvalid,
		ReasonPinMismatch, ReasonTimeout, ReasonNoALPN, ReasonClientCertNeeded,
		ReasonClientCertBad, ReasonTLSFailed, ReasonNoHost, ReasonUnreachable,
		ReasonRefused, ReasonDialFailed,
	}
	// ReasonRefused ends live connections too: the server's host reports
	// its port closed (see udpSocket), a killed server.
	lostReasons = []string{
		ReasonIdleTimeout, ReasonStatelessReset, ReasonServerClosed, ReasonLocalClosed,
		ReasonTransport, ReasonStreamReset, ReasonStreamEOF, ReasonProtocol, ReasonRefused,
		ReasonLostOther,
	}
)

// Reason is an error taken apart: Word and Reason come from fixed lists,
// Detail is the library's own text (it may change between versions).
type Reason struct {
	Word   string
	Reason string
	Detail string
}

// String renders "word: reason (detail)". Words that say it all (timeout,
// closed, queue full) have neither reason nor detail, internal error a
// detail only ("internal error (stream reader)"); free-text words (bad
// config, qrpc) render as "word: detail".
func (r Reason) String() string {
	s := r.Word
	switch {
	case r.Word == WordInternal && r.Detail != "":
		s += " (" + r.Detail + ")"
	case r.Reason != "":
		s += ": " + r.Reason
		if r.Detail != "" {
			s += " (" + r.Detail + ")"
		}
	case r.Detail != "":
		s += ": " + r.Detail
	}
	return s
}

// Reasons lists every word and reason Classify can return (Detail empty),
// except the free-text words bad config and qrpc.
func Reasons() []Reason {
	out := []Reason{{Word: WordTimeout}, {Word: WordClosed}, {Word: WordQueueFull}, {Word: WordInternal}}
	for _, r := range dialReasons {
		out = append(out, Reason{Word: WordConnect, Reason: r})
	}
	for _, r := range []string{ReasonReconnecting, ReasonNoServer, ReasonNoStream, ReasonThrottled} {
		out = append(out, Reason{Word: WordUnavailable, Reason: r})
	}
	for _, r := range dialReasons {
		out = append(out, Reason{Word: WordUnavailable, Reason: r})
	}
	for _, r := range lostReasons {
		if r != ReasonRefused { // listed with the dial reasons
			out = append(out, Reason{Word: WordUnavailable, Reason: r})
		}
	}
	for _, r := range lostReasons {
		out = append(out, Reason{Word: WordConnLost, Reason: r})
	}
	return append(out, Reason{Word: WordTooLarge, Reason: ReasonFrameLimit})
}

// ErrorWord returns the first word of err's string, cheaply (no
// allocation for the errors this package returns): for counting.
func ErrorWord(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrTimeout):
		return WordTimeout
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled):
		return WordClosed
	case errors.Is(err, ErrQueueFull):
		return WordQueueFull
	case errors.Is(err, ErrInternal):
		return WordInternal
	case errors.Is(err, ErrUnavailable):
		// Before connect: "unavailable" carries the last dial failure.
		return WordUnavailable
	case errors.Is(err, ErrDial):
		return WordConnect
	case errors.Is(err, ErrConnLost):
		return WordConnLost
	case errors.Is(err, ErrTooLarge):
		return WordTooLarge
	case errors.Is(err, ErrBadConfig):
		return WordBadConfig
	case errors.Is(err, context.DeadlineExceeded):
		return WordTimeout
	}
	return WordOther
}

// Classify takes any error of this package apart into its word, a reason
// from the fixed lists and the raw text as detail.
func Classify(err error) Reason {
	word := ErrorWord(err)
	switch word {
	case "":
		return Reason{}
	case WordTimeout, WordClosed, WordQueueFull:
		return Reason{Word: word}
	case WordInternal:
		// The word says it all to a caller; what panicked is the detail.
		return Reason{Word: word, Detail: strip(err, ErrInternal)}
	case WordConnect:
		var de *DialError
		if errors.As(err, &de) {
			return Reason{Word: word, Reason: knownDialReason(de.Reason), Detail: dialDetail(de)}
		}
		return Reason{Word: word, Reason: ReasonDialFailed, Detail: err.Error()}
	case WordUnavailable:
		reason, detail := causeOf(err, ErrUnavailable)
		if rest, ok := strings.CutPrefix(detail, reason); ok {
			// "no server up (2 ejected, 0 connecting)": say the reason once.
			detail = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(rest, ": "), " ("), ")")
		}
		return Reason{Word: word, Reason: reason, Detail: detail}
	case WordConnLost:
		reason, detail := causeOf(err, ErrConnLost)
		if reason == ReasonReconnecting || reason == ReasonNoServer || reason == ReasonNoStream || reason == ReasonThrottled || (isDialReason(reason) && reason != ReasonRefused) {
			// A dial reason cannot end a live connection; only text
			// matching could get here.
			reason = ReasonLostOther
		}
		return Reason{Word: word, Reason: reason, Detail: detail}
	case WordTooLarge:
		return Reason{Word: word, Reason: ReasonFrameLimit, Detail: strip(err, ErrTooLarge)}
	case WordBadConfig:
		return Reason{Word: word, Detail: strip(err, ErrBadConfig)}
	}
	return Reason{Word: WordOther, Detail: strings.TrimPrefix(err.Error(), "qrpc: ")}
}

// ErrorString is Classify(err).String().
func ErrorString(err error) string { return Classify(err).String() }

func knownDialReason(r string) string {
	if isDialReason(r) {
		return r
	}
	return ReasonDialFailed
}

func isDialReason(r string) bool {
	for _, d := range dialReasons {
		if d == r {
			return true
		}
	}
	return false
}

func dialDetail(de *DialError) string {
	if de.Err == nil {
		return de.Addr
	}
	return de.Addr + ": " + de.Err.Error()
}

// strip returns err's text without the sentinel's own text in front.
func strip(err, sentinel error) string {
	msg := err.Error()
	if i := strings.Index(msg, sentinel.Error()); i >= 0 {
		msg = msg[i+len(sentinel.Error()):]
	}
	return strings.TrimPrefix(msg, ": ")
}

// causeOf classifies why a connection is gone: from the error chain when
// it is there, else from the text (some paths keep only the cause's text).
func causeOf(err, sentinel error) (reason, detail string) {
	detail = strip(err, sentinel)
	var (
		de    *DialError
		idle  *quic.IdleTimeoutError
		reset *quic.StatelessResetError
		hs    *quic.HandshakeTimeoutError
		app   *quic.ApplicationError
		tr    *quic.TransportError
		st    *quic.StreamError
	)
	switch {
	case errors.As(err, &de):
		return knownDialReason(de.Reason), dialDetail(de)
	case errors.As(err, &idle):
		return ReasonIdleTimeout, detail
	case errors.As(err, &reset):
		return ReasonStatelessReset, detail
	case errors.As(err, &hs):
		return ReasonTimeout, detail
	case errors.As(err, &app):
		if app.Remote {
			return ReasonServerClosed, detail
		}
		return ReasonLocalClosed, detail
	case errors.As(err, &tr):
		if tr.Remote && tr.ErrorCode == quic.NoError {
			return ReasonServerClosed, detail
		}
		return ReasonTransport, detail
	case errors.As(err, &st):
		return ReasonStreamReset, detail
	case errors.Is(err, ErrProtocol):
		return ReasonProtocol, detail
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReasonRefused, detail
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ReasonStreamEOF, detail
	case errors.Is(err, net.ErrClosed):
		return ReasonLocalClosed, detail
	}
	reason = reasonFromText(detail)
	if rest, ok := strings.CutPrefix(detail, "connect "); ok && isDialReason(reason) {
		// "connect ADDR: REASON: ERR", as DialError prints it: the same
		// detail as when the DialError itself is at hand.
		detail = strings.Replace(rest, ": "+reason, "", 1)
	}
	return reason, detail
}

// reasonFromText recognises the texts of the errors causeOf matches by
// type, for errors that carry a cause's text only ("%v").
func reasonFromText(msg string) string {
	if strings.HasPrefix(msg, "connect ") {
		for _, r := range dialReasons {
			if strings.Contains(msg, ": "+r+": ") || strings.HasSuffix(msg, ": "+r) {
				return r
			}
		}
		return ReasonDialFailed
	}
	has := func(s string) bool { return strings.Contains(msg, s) }
	switch {
	case msg == ReasonReconnecting:
		return ReasonReconnecting
	case strings.HasPrefix(msg, ReasonNoServer):
		return ReasonNoServer
	case strings.HasPrefix(msg, ReasonNoStream):
		return ReasonNoStream
	case msg == ReasonThrottled:
		return ReasonThrottled
	case has("no recent network activity"):
		return ReasonIdleTimeout
	case has("received a stateless reset"):
		return ReasonStatelessReset
	case has("handshake did not complete in time"):
		return ReasonTimeout
	case has("Application error") && has("(remote)"):
		return ReasonServerClosed
	case has("Application error"):
		return ReasonLocalClosed
	case has("NO_ERROR (remote)"):
		return ReasonServerClosed
	case has(" (remote)"), has(" (local)"):
		return ReasonTransport
	case has(" canceled by remote with error code"), has(" canceled by local with error code"):
		return ReasonStreamReset
	case has(ErrProtocol.Error()):
		return ReasonProtocol
	case has("connection refused"):
		return ReasonRefused
	case has("EOF"):
		return ReasonStreamEOF
	}
	return ReasonLostOther
}
