package qrpc_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
)

// isListed reports whether r's word and reason are in qrpc.Reasons().
func isListed(r qrpc.Reason) bool {
	return slices.Contains(qrpc.Reasons(), qrpc.Reason{Word: r.Word, Reason: r.Reason})
}

// checkReason checks that err renders as want, optionally followed by
// " (detail)", and that its word and reason are listed.
func checkReason(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", want)
	}
	got := qrpc.ErrorString(err)
	rest, ok := strings.CutPrefix(got, want)
	if !ok || (rest != "" && !(strings.HasPrefix(rest, " (") && strings.HasSuffix(rest, ")"))) {
		t.Fatalf("error %q (from %v), want %q or %q", got, err, want, want+" (...)")
	}
	if r := qrpc.Classify(err); !isListed(r) {
		t.Fatalf("%+v is not in qrpc.Reasons()", r)
	}
	t.Logf("%s", got)
}

// TestReasonsOverQUIC produces each reason for real, over QUIC on
// loopback, and checks the string a caller gets.
func TestReasonsOverQUIC(t *testing.T) {
	checkGoroutines(t)

	t.Run("timeout", func(t *testing.T) {
		e := newEnv(t)
		c := e.dial(t, nil)
		_, err := unary(c, 100*time.Millisecond, "sleep", []byte("1000"))
		checkReason(t, err, "timeout")
		if got := qrpc.ErrorString(err); got != "timeout" {
			t.Fatalf("a timeout renders as %q, want exactly \"timeout\"", got)
		}
	})

	t.Run("closed", func(t *testing.T) {
		e := newEnv(t)
		c := e.dial(t, &qrpc.Config{CloseLinger: -1})
		errc := make(chan error, 1)
		go func() {
			_, err := unary(c, 10*time.Second, "block", nil)
			errc <- err
		}()
		testwait.Until(t, "call in flight", 5*time.Second, func() bool { return c.Stats().InFlight == 1 })
		_ = c.Close()
		checkReason(t, <-errc, "closed") // in flight
		_, err := unary(c, time.Second, "echo", nil)
		checkReason(t, err, "closed") // after
	})

	t.Run("too large", func(t *testing.T) {
		e := newEnv(t)
		c := e.dial(t, &qrpc.Config{MaxFrameSize: 1024})
		body := make([]byte, 4096)
		_, _ = rand.Read(body)
		_, err := unary(c, time.Second, "echo", body)
		checkReason(t, err, "too large: request exceeds max_frame_size")
	})

	t.Run("nothing listening", func(t *testing.T) {
		// The kernel answers ICMP port unreachable, which the client's
		// socket hears (IP_RECVERR): refused at once, not a timeout.
		addr := closedPort(t)
		e := newEnv(t)
		began := time.Now()
		_, err := qrpc.Dial(t.Context(), addr, e.config(&qrpc.Config{DialTimeout: 5 * time.Second}))
		checkReason(t, err, "connect: refused")
		if d := time.Since(began); d > 2500*time.Millisecond {
			t.Fatalf("refused after %v, want well before the 5 s dial timeout", d)
		}
	})

	t.Run("nothing answering", func(t *testing.T) {
		// A port that is open but silent (a frozen server): a timeout.
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		e := newEnv(t)
		_, err = qrpc.Dial(t.Context(), pc.LocalAddr().String(), e.config(&qrpc.Config{DialTimeout: 500 * time.Millisecond}))
		checkReason(t, err, "connect: timeout")
	})

	t.Run("unknown authority", func(t *testing.T) {
		e := newEnv(t)
		_, err := qrpc.Dial(t.Context(), e.addr, &qrpc.Config{Logger: quiet, DialTimeout: 2 * time.Second})
		checkReason(t, err, "connect: certificate signed by unknown authority")
	})

	t.Run("server closing", func(t *testing.T) {
		e := newEnv(t)
		c := e.dial(t, &qrpc.Config{BackoffBase: 5 * time.Second, BackoffMax: 5 * time.Second})
		errc := make(chan error, 1)
		go func() {
			_, err := unary(c, 10*time.Second, "block", nil)
			errc <- err
		}()
		testwait.Until(t, "call in flight", 5*time.Second, func() bool { return c.Stats().InFlight == 1 })
		// Shutdown gives the blocked handler 50 ms, then closes the
		// connection with "server closing".
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_ = e.srv.Shutdown(ctx)
		err := <-errc
		checkReason(t, err, "connection lost: closed by server")
		if !strings.Contains(qrpc.ErrorString(err), "server closing") {
			t.Fatalf("%q: the detail should carry the server's message", qrpc.ErrorString(err))
		}
		// The next call is not sent, and says why at once (the dead
		// qconn tells until its slot has recorded it): the server
		// closing, or (once the first re-dial, made at once, has been
		// refused by the closed port) that refusal.
		_, err = unary(c, time.Second, "echo", nil)
		if qrpc.Classify(err).Reason == qrpc.ReasonRefused {
			checkReason(t, err, "unavailable: refused")
		} else {
			checkReason(t, err, "unavailable: closed by server")
		}
	})

	t.Run("unavailable after a failed re-dial", func(t *testing.T) {
		e := newEnv(t)
		c := e.dial(t, &qrpc.Config{BackoffBase: 10 * time.Millisecond, BackoffMax: 10 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
		_ = e.srv.Close()
		var err error
		testwait.Until(t, "unavailable: refused", 10*time.Second, func() bool {
			_, err = unary(c, time.Second, "echo", nil)
			return strings.HasPrefix(qrpc.ErrorString(err), "unavailable: refused")
		})
		checkReason(t, err, "unavailable: refused")
	})

	t.Run("stateless reset", func(t *testing.T) {
		e := newEnv(t)
		_ = e.srv.Close()
		// The new server binds the port before the old one's socket is
		// closed (SO_REUSEPORT): the port is never closed, so no ICMP
		// port unreachable ("refused") can come first.
		pc, err := testsrv.ListenReusePort("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := pc.LocalAddr().String()
		c := e.serveOn(t, pc, &qrpc.Config{BackoffBase: 5 * time.Second})
		// Quiet first: once the fresh socket shares the port, the kernel
		// may hand it any packet of this client's, and a late ACK of the
		// handshake would bring the reset before the call does (the call
		// then sees "unavailable: reconnecting"; seen under load).
		if _, err := unary(c, 3*time.Second, "echo", nil); err != nil {
			t.Fatal(err)
		}
		// The ACK leaves no trace the test can read: the pause outlasts
		// QUIC's delayed-ACK timer, a protocol timer, not a race.
		time.Sleep(100 * time.Millisecond) // the scenario: a quiet connection (no ACK pending, max_ack_delay 25 ms) when the fresh socket takes the port
		pc2, err := testsrv.ListenReusePort(addr)
		if err != nil {
			t.Fatal(err)
		}
		fresh := e.newServer()
		if err := fresh.ServePacketConn(pc2, qrpc.ServerTLSConfig(e.cert, nil)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fresh.Close(); _ = pc2.Close() })
		_ = pc.Close() // killed: no CONNECTION_CLOSE
		_, err = unary(c, 3*time.Second, "echo", nil)
		checkReason(t, err, "connection lost: stateless reset")
	})

	t.Run("idle timeout", func(t *testing.T) {
		e := newEnv(t)
		_ = e.srv.Close()
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		mp := &testsrv.MutePacketConn{PacketConn: pc}
		srv := e.newServer()
		if err := srv.ServePacketConn(mp, qrpc.ServerTLSConfig(e.cert, nil)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.unblock(); _ = srv.Close() })
		c, err := qrpc.Dial(t.Context(), pc.LocalAddr().String(), e.config(&qrpc.Config{IdleTimeout: time.Second, BackoffBase: 5 * time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		errc := make(chan error, 1)
		go func() {
			_, err := unary(c, 20*time.Second, "block", nil)
			errc <- err
		}()
		testwait.Until(t, "call in flight", 5*time.Second, func() bool { return c.Stats().InFlight == 1 })
		mp.Mute(true) // the server goes silent, its port open
		checkReason(t, <-errc, "connection lost: idle timeout")
	})

	// Servers that misbehave on a stream, one request each.
	misbehave := []struct {
		name string
		do   func(st *quic.Stream)
		want string
	}{
		{"stream reset", func(st *quic.Stream) { st.CancelWrite(7) }, "connection lost: stream reset"},
		{"stream closed", func(st *quic.Stream) { _ = st.Close() }, "connection lost: stream closed by server"},
		{"protocol error", func(st *quic.Stream) { _, _ = st.Write([]byte{0, 0, 0, 1, 99}) }, "connection lost: protocol error"},
	}
	for _, m := range misbehave {
		t.Run(m.name, func(t *testing.T) {
			e := newEnv(t)
			addr := rawServer(t, e, func(c *quic.Conn) {
				st, err := c.AcceptStream(c.Context())
				if err != nil {
					return
				}
				r := frame.New(0).NewReader(st)
				if _, _, err := r.Next(); err != nil {
					return
				}
				m.do(st)
				<-c.Context().Done()
			})
			c, err := qrpc.Dial(t.Context(), addr, e.config(&qrpc.Config{Streams: 1, BackoffBase: 5 * time.Second}))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = unary(c, 5*time.Second, "echo", nil)
			checkReason(t, err, m.want)
		})
	}
}

// closedPort returns a loopback UDP address nobody listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	_ = pc.Close()
	return addr
}

// TestClassifyShapes: errors as the library wraps them, by type and by
// text only (some paths keep a cause's text, not the cause), classify the
// same way, and everything lands on a listed reason.
func TestClassifyShapes(t *testing.T) {
	dial := &qrpc.DialError{Addr: "10.0.0.1:1", Reason: qrpc.ReasonTimeout, Err: errors.New("timeout: handshake did not complete in time")}
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: no response within 5s", qrpc.ErrTimeout), "timeout"},
		{context.DeadlineExceeded, "timeout"},
		{qrpc.ErrClosed, "closed"},
		{context.Canceled, "closed"},
		{qrpc.ErrQueueFull, "queue full"},
		{dial, "connect: timeout (10.0.0.1:1: timeout: handshake did not complete in time)"},
		{&qrpc.DialError{Addr: "a:1", Reason: "made up", Err: io.EOF}, "connect: failed (a:1: EOF)"},
		{fmt.Errorf("%w: %w", qrpc.ErrUnavailable, dial), "unavailable: timeout (10.0.0.1:1: timeout: handshake did not complete in time)"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, dial), "unavailable: timeout (10.0.0.1:1: timeout: handshake did not complete in time)"},
		{fmt.Errorf("%w: reconnecting", qrpc.ErrUnavailable), "unavailable: reconnecting"},
		{fmt.Errorf("%w: no server up (2 ejected, 1 connecting)", qrpc.ErrUnavailable), "unavailable: no server up (2 ejected, 1 connecting)"},
		{fmt.Errorf("%w: no stream in service", qrpc.ErrUnavailable), "unavailable: no stream in service"},
		{fmt.Errorf("%w: stream: %v", qrpc.ErrConnLost, &quic.StreamError{StreamID: 8, ErrorCode: 1, Remote: true}), "connection lost: stream reset (stream: stream 8 canceled by remote with error code 1)"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, &quic.IdleTimeoutError{}), "connection lost: idle timeout (timeout: no recent network activity)"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, &quic.IdleTimeoutError{}), "unavailable: idle timeout (timeout: no recent network activity)"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, &quic.StatelessResetError{}), "connection lost: stateless reset (received a stateless reset)"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, &quic.StatelessResetError{}), "unavailable: stateless reset (received a stateless reset)"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, &quic.ApplicationError{Remote: true, ErrorMessage: "server closing"}), "connection lost: closed by server (Application error 0x0 (remote): server closing)"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, &quic.ApplicationError{ErrorMessage: "x"}), "connection lost: closed locally (Application error 0x0 (local): x)"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, &quic.TransportError{Remote: true, ErrorCode: quic.NoError}), "connection lost: closed by server (NO_ERROR (remote))"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, &quic.TransportError{Remote: true, ErrorCode: quic.ProtocolViolation}), "connection lost: transport error (PROTOCOL_VIOLATION (remote))"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, &quic.TransportError{Remote: true, ErrorCode: quic.ProtocolViolation}), "unavailable: transport error (PROTOCOL_VIOLATION (remote))"},
		{fmt.Errorf("%w: write: %w", qrpc.ErrConnLost, &quic.StreamError{StreamID: 4, ErrorCode: 7, Remote: true}), "connection lost: stream reset (write: stream 4 canceled by remote with error code 7)"},
		{fmt.Errorf("%w: write: %v", qrpc.ErrConnLost, &quic.StreamError{StreamID: 4, ErrorCode: 7, Remote: true}), "connection lost: stream reset (write: stream 4 canceled by remote with error code 7)"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, io.EOF), "connection lost: stream closed by server (EOF)"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, fmt.Errorf("%w: bad", qrpc.ErrProtocol)), "connection lost: protocol error (qrpc: protocol error: bad)"},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, errors.New("something new")), "connection lost: other (something new)"},
		{fmt.Errorf("%w: 20000 bytes, limit 1024", qrpc.ErrTooLarge), "too large: request exceeds max_frame_size (20000 bytes, limit 1024)"},
		{fmt.Errorf("%w: conns must be 1..64", qrpc.ErrBadConfig), "bad config: conns must be 1..64"},
		{errors.New("qrpc: something else"), "qrpc: something else"},
	}
	for _, c := range cases {
		got := qrpc.ErrorString(c.err)
		if got != c.want {
			t.Errorf("%v: got %q, want %q", c.err, got, c.want)
		}
		r := qrpc.Classify(c.err)
		if r.Word != qrpc.WordBadConfig && r.Word != qrpc.WordOther && !isListed(r) {
			t.Errorf("%v: %+v is not listed", c.err, r)
		}
	}
	if qrpc.ErrorString(nil) != "" {
		t.Error("nil error renders as non-empty")
	}
}

// TestReasonsDocumented: the reasons table in docs/api.md ("## Errors") lists
// exactly what qrpc.Reasons() returns.
func TestReasonsDocumented(t *testing.T) {
	f, err := os.Open("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Rows of the reasons table: | `word` | `reason` | meaning |, or a row
	// of a word without reason: | `word` | | meaning |.
	row := regexp.MustCompile("^\\| `([a-z ]+)` \\| (`[^`]+`)? *\\|")
	var inErrors, inTable bool
	documented := map[qrpc.Reason]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			inErrors = line == "## Errors"
		case inErrors && strings.HasPrefix(line, "| word | reason |"):
			inTable = true
		case inTable && !strings.HasPrefix(line, "|"):
			inTable = false
		case inTable:
			m := row.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			r := qrpc.Reason{Word: m[1], Reason: strings.Trim(m[2], "`")}
			if documented[r] {
				t.Errorf("docs/api.md lists %q twice", r.String())
			}
			documented[r] = true
		}
	}
	if len(documented) == 0 {
		t.Fatal("no reasons table (| word | reason | meaning |) in the Errors section of docs/api.md")
	}
	// "unavailable" takes every reason of connect and connection lost too;
	// docs/api.md says so in one sentence instead of repeating them.
	listed := map[qrpc.Reason]bool{}
	for _, r := range qrpc.Reasons() {
		if listed[r] {
			t.Errorf("qrpc.Reasons() lists %q twice", r.String())
		}
		listed[r] = true
	}
	for r := range listed {
		if r.Word == qrpc.WordUnavailable && r.Reason != qrpc.ReasonReconnecting && r.Reason != qrpc.ReasonNoServer && r.Reason != qrpc.ReasonNoStream && r.Reason != qrpc.ReasonThrottled {
			if !listed[qrpc.Reason{Word: qrpc.WordConnect, Reason: r.Reason}] && !listed[qrpc.Reason{Word: qrpc.WordConnLost, Reason: r.Reason}] {
				t.Errorf("%q is neither a connect nor a connection lost reason", r.String())
			}
			continue
		}
		if !documented[r] {
			t.Errorf("%q is missing from the reasons table of docs/api.md", r.String())
		}
	}
	for r := range documented {
		if !listed[r] {
			t.Errorf("docs/api.md lists %q, which qrpc.Reasons() does not", r.String())
		}
	}
}
