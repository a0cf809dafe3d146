package qrpc_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// fastRedial keeps the restart tests short: re-dials after 50 ms, 80 ms, ...
// capped at 200 ms, each given a second.
func fastRedial() *qrpc.Config {
	return &qrpc.Config{BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, DialTimeout: time.Second}
}

// failsFast makes a call with a generous deadline and checks that it fails
// with one of the "no connection" errors long before that deadline.
func failsFast(t *testing.T, c *qrpc.Client) error {
	t.Helper()
	began := time.Now()
	_, err := unary(c, 3*time.Second, "echo", []byte("x"))
	if err == nil {
		return nil
	}
	if !errors.Is(err, qrpc.ErrUnavailable) && !errors.Is(err, qrpc.ErrConnLost) {
		t.Fatalf("call while the server is down: %v, want ErrUnavailable or ErrConnLost", err)
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("call while the server is down took %v to fail", d)
	}
	return err
}

// recovers waits until calls succeed again, with nothing done by the caller.
func recovers(t *testing.T, c *qrpc.Client) {
	t.Helper()
	var err error
	if !testwait.For(10*time.Second, func() bool {
		_, err = unary(c, time.Second, "echo", []byte("x"))
		return err == nil
	}) {
		t.Fatalf("no recovery after the restart: %v", err)
	}
}

// TestServerRestartGraceful: the server shuts down (sending CONNECTION_CLOSE)
// and a new one starts on the same port with the same certificate.
func TestServerRestartGraceful(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, fastRedial())
	if _, err := unary(c, 5*time.Second, "echo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	// Down: calls fail at once, each time.
	sawFailure := false
	for i := 0; i < 5; i++ {
		if err := failsFast(t, c); err != nil {
			sawFailure = true
		}
		time.Sleep(30 * time.Millisecond) // the scenario: calls spread over the down time, through re-dials
	}
	if !sawFailure {
		t.Fatal("calls succeeded with the server down")
	}
	if err := failsFast(t, c); err == nil || !errors.Is(err, qrpc.ErrUnavailable) {
		t.Fatalf("while re-dialling: %v, want ErrUnavailable", err)
	}

	srv2 := e.newServer()
	if _, err := srv2.Listen(e.addr, qrpc.ServerTLSConfig(e.cert, nil)); err != nil {
		t.Fatalf("restart on the same port: %v", err)
	}
	t.Cleanup(func() { _ = srv2.Close() })
	recovers(t, c)
	if s := c.Stats(); s.Reconnects < 1 || s.InFlight != 0 {
		t.Fatalf("stats after recovery: %+v", s)
	}
}

// TestServerRestartKill: the old server vanishes without a word (its socket
// closed under it, as when the process is killed). A new server with the
// same stateless-reset key answers the client's next packet with a
// stateless reset, so the client learns at once that its connection is
// gone instead of waiting for its idle timeout.
func TestServerRestartKill(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	_ = e.srv.Close() // this test runs its own, killable, server

	for _, sameKey := range []bool{true, false} {
		name := "same reset key"
		if !sameKey {
			name = "other reset key"
		}
		t.Run(name, func(t *testing.T) {
			// A packet the client sends on its own (an ACK, a path MTU
			// probe) can reach the port between the kill and the restart
			// and bring back ICMP port unreachable, which ends the
			// connection as it should (TestICMPErrors): the scenario did not
			// happen, so it runs again (seen once in CI, under -race).
			for attempt := 1; attempt <= 3; attempt++ {
				if !restartKill(t, e, sameKey) {
					return
				}
				t.Logf("attempt %d: the port refused a packet between the kill and the restart; again", attempt)
			}
			t.Fatal("3 attempts: each time the port refused a packet between the kill and the restart")
		})
	}
}

// restartKill runs TestServerRestartKill's scenario once. It returns true
// when the port refused a packet between the kill and the restart, so the
// scenario is to be run again.
func restartKill(t *testing.T, e *env, sameKey bool) bool {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	c := e.serveOn(t, pc, fastRedial())
	if _, err := unary(c, 5*time.Second, "echo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	// Quiet before the kill: the client ACKs that answer up to
	// max_ack_delay (25 ms) later, and an ACK reaching the fresh
	// server would bring the reset before the call below does (it
	// then sees "unavailable: stateless reset"; seen once in CI). The
	// ACK leaves no trace the test can read: the pause outlasts QUIC's
	// delayed-ACK timer, a protocol timer, not a race with a goroutine.
	time.Sleep(100 * time.Millisecond) // the scenario: a quiet connection (no ACK pending) when the server dies

	_ = pc.Close() // kill: no CONNECTION_CLOSE can leave
	// The same key by default: derived from the same certificate.
	var key *quic.StatelessResetKey
	if !sameKey {
		key = new(quic.StatelessResetKey)
		key[0] = 1
	}
	fresh := qrpc.NewServer(&qrpc.ServerConfig{StatelessResetKey: key, Logger: quiet})
	fresh.Handle("echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) { resp.Body = req.Body })
	if _, err := fresh.Listen(addr, qrpc.ServerTLSConfig(e.cert, nil)); err != nil {
		t.Fatalf("restart on the same port: %v", err)
	}
	t.Cleanup(func() { _ = fresh.Close() })

	began := time.Now()
	_, err = unary(c, 700*time.Millisecond, "echo", []byte("x"))
	// As ErrConnLost with the error in its chain, or, when the refusal
	// ended the connection before the call, as ErrUnavailable with it in
	// the text only (the dead qconn's cause, or the refused re-dial's;
	// never a bare "unavailable: reconnecting").
	if errors.Is(err, syscall.ECONNREFUSED) || (err != nil && strings.Contains(err.Error(), "connection refused")) {
		return true
	}
	if sameKey {
		// The call's packet brings the reset, which fails the
		// call; or a packet the client sent on its own (a delayed
		// ACK, a path MTU probe: seen twice in CI, once under
		// -race after the 100 ms above) brought it first, and the
		// call finds the client re-dialling. Either way fast: with
		// another key (below) the call waits out its deadline.
		var sr *quic.StatelessResetError
		switch {
		case errors.Is(err, qrpc.ErrConnLost):
			if !errors.As(err, &sr) {
				t.Fatalf("first call after the kill: %v, want a stateless reset as the cause", err)
			}
		case errors.Is(err, qrpc.ErrUnavailable):
			t.Logf("the reset came before the call: %v", err)
		default:
			t.Fatalf("first call after the kill: %v, want ErrConnLost (stateless reset)", err)
		}
		if d := time.Since(began); d > 500*time.Millisecond {
			t.Fatalf("the reset took %v", d)
		}
		recovers(t, c)
		if c.Stats().Reconnects < 1 {
			t.Fatal("no reconnect counted")
		}
		return false
	}
	// Without the key the new server cannot reset the connection:
	// the call waits out its deadline. This is why the key matters.
	if !errors.Is(err, qrpc.ErrTimeout) {
		t.Fatalf("with another reset key: %v, want the call to time out", err)
	}
	return false
}
