//go:build qrpctesthooks

package qrpc_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// ends records the ends of a test's calls: how many times each call's
// done ran, and with what.
type ends struct {
	mu    sync.Mutex
	count map[int]int
	errs  map[int]error
	total atomic.Int64
}

func newEnds() *ends { return &ends{count: map[int]int{}, errs: map[int]error{}} }

// done is call i's Done; with panicking set it panics after recording an
// error (a bug in the caller's Done).
func (e *ends) done(i int, panicking bool) qrpc.Done {
	return func(_ *qrpc.Response, err error) {
		e.mu.Lock()
		e.count[i]++
		e.errs[i] = err
		e.mu.Unlock()
		e.total.Add(1)
		if panicking && err != nil {
			panic("a bug in the caller's Done")
		}
	}
}

// check waits (bounded) for n calls to end and fails the test unless each
// ended once; it returns how many ended with ErrInternal.
func (e *ends) check(t *testing.T, n int) int {
	t.Helper()
	testwait.Until(t, "every call to end", 30*time.Second, func() bool { return e.total.Load() >= int64(n) })
	e.mu.Lock()
	defer e.mu.Unlock()
	internal := 0
	for i := range n {
		if e.count[i] != 1 {
			t.Errorf("call %d ended %d times", i, e.count[i])
		}
		if errors.Is(e.errs[i], qrpc.ErrInternal) {
			internal++
		}
	}
	return internal
}

func reportsTo(t *testing.T) func(where string) int {
	var mu sync.Mutex
	seen := map[string]int{}
	safego.SetReporter(func(where string, _ any, _ []byte) {
		mu.Lock()
		defer mu.Unlock()
		seen[where]++
	})
	t.Cleanup(func() { safego.SetReporter(nil) })
	return func(where string) int {
		mu.Lock()
		defer mu.Unlock()
		return seen[where]
	}
}

// TestPanicWhileFailingConnection: a connection that fails (its server
// closes) ends each of its calls exactly once though something panics on
// the way: the caller's Done of every call, or the library itself part
// way through (an injected panic), whose call then ends with ErrInternal.
func TestPanicWhileFailingConnection(t *testing.T) {
	for _, c := range []struct {
		name      string
		panicking bool // every Done panics
		inject    int  // panics injected while the calls are failed
	}{{"done panics", true, 0}, {"injected", false, 1}, {"injected and done panics", true, 2}} {
		t.Run(c.name, func(t *testing.T) {
			reports := reportsTo(t)
			e := newEnv(t)
			cl := e.dial(t, &qrpc.Config{BackoffBase: time.Minute, BackoffMax: time.Minute})
			const n = 16
			got := newEnds()
			for i := range n {
				if _, err := cl.Start(&qrpc.Call{Method: []byte("block")}, got.done(i, c.panicking)); err != nil {
					t.Fatal(err)
				}
			}
			testwait.Until(t, "the calls at the server", 10*time.Second, func() bool { return cl.Stats().InFlight == n })
			safego.Arm("connection fail", c.inject)
			defer safego.Arm("connection fail", 0)
			_ = e.srv.Close()
			if internal := got.check(t, n); internal != c.inject {
				t.Errorf("%d calls ended with internal error, want %d", internal, c.inject)
			}
			if c.inject > 0 && reports("connection fail") < c.inject {
				t.Errorf("%d panics reported in connection fail, want %d", reports("connection fail"), c.inject)
			}
			if n := cl.Stats().InFlight; n != 0 {
				t.Errorf("InFlight %d after the connection failed", n)
			}
		})
	}
}

// TestReaderCleanupPanicKeepsStreamServed: a stream reader that panics
// holding a call is cleaned up (the call fails with ErrInternal, the
// stream goes out of service and its other calls end, another stream
// takes its place) though the cleanup panics too: in the held call's Done,
// or in the library part way (a second injected panic).
func TestReaderCleanupPanicKeepsStreamServed(t *testing.T) {
	for _, c := range []struct {
		name      string
		panicking bool
		inject    int
	}{{"done panics", true, 1}, {"cleanup panics", false, 2}} {
		t.Run(c.name, func(t *testing.T) {
			reportsTo(t)
			e := newEnv(t)
			cl := e.dial(t, &qrpc.Config{Streams: 1})
			got := newEnds()
			// Call 0 waits on the stream; call 1's answer is read with a
			// panic armed.
			if _, err := cl.Start(&qrpc.Call{Method: []byte("block")}, got.done(0, false)); err != nil {
				t.Fatal(err)
			}
			testwait.Until(t, "the blocked call at the server", 10*time.Second, func() bool { return cl.Stats().InFlight == 1 })
			safego.Arm("stream reader", c.inject)
			defer safego.Arm("stream reader", 0)
			if _, err := cl.Start(&qrpc.Call{Method: []byte("echo")}, got.done(1, c.panicking)); err != nil {
				t.Fatal(err)
			}
			if internal := got.check(t, 2); internal != 2 {
				t.Errorf("%d calls ended with internal error, want both (the stream's)", internal)
			}
			// Another stream takes its place: a call made while it opens
			// is refused as never sent (unavailable), then calls answer.
			testwait.Until(t, "a call answered after the reader's panic", 10*time.Second, func() bool {
				resp, err := unary(cl, 5*time.Second, "echo", []byte("after"))
				if err != nil && !errors.Is(err, qrpc.ErrUnavailable) {
					t.Fatalf("a call after the reader's panic: %v", err)
				}
				return err == nil && string(resp.Body) == "after"
			})
			if n := cl.Stats().InFlight; n != 0 {
				t.Errorf("InFlight %d", n)
			}
		})
	}
}

// TestCallbackPanicsContained: the callbacks the client hands to quic-go
// and crypto/tls, which run on quic-go's goroutines (the pin check, the
// token store that signals the server's confirmation, the socket quic-go
// reads and writes through), do not end the process when they panic: the
// handshake or the connection fails instead (or, for the confirmation,
// the dial goes on), the panic is counted under its kind, and the client
// serves the next call.
func TestCallbackPanicsContained(t *testing.T) {
	for _, c := range []struct {
		where     string
		dialFail  bool // the dial with the panic fails
		afterDial bool // armed once the connection is up
	}{{"tls callback", true, false}, {"quic callback", false, false}, {"socket", false, true}} {
		t.Run(c.where, func(t *testing.T) {
			reports := reportsTo(t)
			e := newEnv(t)
			leaf, err := x509.ParseCertificate(e.cert.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			pin := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
			cfg := func() *qrpc.Config {
				return e.config(&qrpc.Config{Pins: [][]byte{pin[:]}, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
			}
			if !c.afterDial {
				safego.Arm(c.where, 1)
			}
			defer safego.Arm(c.where, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl, err := qrpc.Dial(ctx, e.addr, cfg())
			if c.dialFail {
				if err == nil {
					_ = cl.Close()
					t.Fatal("the dial whose pin check panicked succeeded")
				}
				cl, err = qrpc.Dial(ctx, e.addr, cfg())
			}
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if c.afterDial {
				safego.Arm(c.where, 1)
				_, _ = unary(cl, 2*time.Second, "echo", nil) // its answer meets the panic
			}
			testwait.Until(t, "the panic to happen", 10*time.Second, func() bool { return reports(c.where) == 1 })
			// The next calls answer (a socket's panic ends its connection:
			// the client dials again).
			testwait.Until(t, "a call to answer", 10*time.Second, func() bool {
				resp, err := unary(cl, 2*time.Second, "echo", []byte("after"))
				return err == nil && string(resp.Body) == "after"
			})
		})
	}
}
