package qrpc_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

var quiet = slog.New(slog.DiscardHandler)

// env is a server with a CA-signed certificate for 127.0.0.1/localhost and
// a fixed set of handlers, plus what a test needs to restart it.
type env struct {
	ca       *certs.CA
	cert     tls.Certificate
	resetKey *quic.StatelessResetKey
	srv      *qrpc.Server
	addr     string

	events   atomic.Int64 // "notify" events received
	sleeping atomic.Int64 // "sleep" handlers running
	lastEvt  atomic.Pointer[qrpc.Request]
	release  chan struct{} // "block" handlers wait on it
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ca, cert, err := certs.NewLocal("test ca")
	if err != nil {
		t.Fatal(err)
	}
	key, err := qrpc.ResetKeyFromCertificate(cert)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{ca: ca, cert: cert, resetKey: key, release: make(chan struct{})}
	e.srv = e.newServer()
	a, err := e.srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(cert, nil))
	if err != nil {
		t.Fatal(err)
	}
	e.addr = a.String()
	t.Cleanup(func() {
		e.unblock()
		_ = e.srv.Close()
	})
	return e
}

func (e *env) unblock() {
	select {
	case <-e.release:
	default:
		close(e.release)
	}
}

// newServer returns a server with the test handlers, not yet listening.
func (e *env) newServer() *qrpc.Server {
	srv := qrpc.NewServer(&qrpc.ServerConfig{StatelessResetKey: e.resetKey, Logger: quiet})
	srv.Handle("echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		resp.Headers = req.Headers
		resp.Body = req.Body
	})
	// "code" answers with the code in the "x-code" header and a server header.
	srv.Handle("code", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		for i := 0; i+1 < len(req.Headers); i += 2 {
			if string(req.Headers[i]) == "x-code" {
				n, _ := strconv.Atoi(string(req.Headers[i+1]))
				resp.Code = uint32(n)
			}
		}
		resp.Headers = [][]byte{[]byte("x-server"), []byte("test"), []byte("x-method"), req.Method}
		resp.Body = []byte("code " + strconv.Itoa(int(resp.Code)))
	})
	// "sleep" answers after the number of milliseconds in the body.
	srv.Handle("sleep", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		ms, _ := strconv.Atoi(string(req.Body))
		e.sleeping.Add(1)
		defer e.sleeping.Add(-1)
		time.Sleep(time.Duration(ms) * time.Millisecond) // the handler's work: the scenario
		resp.Body = []byte("slept")
	})
	srv.Handle("block", func(ctx context.Context, _ *qrpc.Request, resp *qrpc.Response) {
		select {
		case <-e.release:
		case <-ctx.Done():
		}
		resp.Body = []byte("released")
	})
	srv.Handle("panic", func(context.Context, *qrpc.Request, *qrpc.Response) {
		panic("handler bug")
	})
	srv.HandleEvent("notify", func(_ context.Context, req *qrpc.Request) {
		e.lastEvt.Store(req)
		e.events.Add(1)
	})
	srv.HandleEvent("panic", func(context.Context, *qrpc.Request) { panic("event handler bug") })
	return srv
}

func (e *env) config(cfg *qrpc.Config) *qrpc.Config {
	if cfg == nil {
		cfg = &qrpc.Config{}
	}
	if cfg.CAPEM == nil {
		cfg.CAPEM = e.ca.CertPEM
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	return cfg
}

func (e *env) dial(t testing.TB, cfg *qrpc.Config) *qrpc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, e.addr, e.config(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// serveOn serves a new server on pc and dials it: the set-up of tests
// that kill or replace that server (through pc) while the client stays.
func (e *env) serveOn(t testing.TB, pc net.PacketConn, cfg *qrpc.Config) *qrpc.Client {
	t.Helper()
	srv := e.newServer()
	if err := srv.ServePacketConn(pc, qrpc.ServerTLSConfig(e.cert, nil)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := qrpc.Dial(t.Context(), pc.LocalAddr().String(), e.config(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func unary(c *qrpc.Client, timeout time.Duration, method string, body []byte, headers ...[]byte) (*qrpc.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Unary(ctx, method, body, headers...)
}

// checkGoroutines fails the test if, once the test's cleanups have run,
// goroutines started during it are still alive. Register it first so that
// its cleanup runs last.
func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		// A leak stays forever; what ends late is a quic-go transport
		// whose last connection went away by idle timeout (5 s in the
		// hostile-server tests when a close packet is lost on a loaded
		// machine) and then drains. Seen once past a 5 s wait.
		if !testwait.For(15*time.Second, func() bool { return runtime.NumGoroutine() <= before }) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Errorf("%d goroutines left, %d before the test:\n%s", runtime.NumGoroutine(), before, buf[:n])
		}
	})
}

func TestUnaryHeadersAndCode(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, nil)
	for _, code := range []int{0, 7, 1<<32 - 1} {
		resp, err := unary(c, 5*time.Second, "code", []byte("in"), []byte("x-code"), []byte(strconv.Itoa(code)), []byte("k"), []byte("v"))
		if err != nil {
			t.Fatalf("code %d: a non-zero code is an answer, not an error: %v", code, err)
		}
		want := [][]byte{[]byte("x-server"), []byte("test"), []byte("x-method"), []byte("code")}
		if resp.Code != uint32(code) || string(resp.Body) != fmt.Sprintf("code %d", code) || fmt.Sprint(resp.Headers) != fmt.Sprint(want) {
			t.Fatalf("code %d: got code %d body %q headers %q", code, resp.Code, resp.Body, resp.Headers)
		}
	}
	// Headers travel both ways unchanged, including empty values and bytes
	// that are not text.
	hs := [][]byte{[]byte("a"), {}, []byte("bin"), {0, 0xff, '\n'}, []byte("a"), []byte("dup")}
	resp, err := unary(c, 5*time.Second, "echo", nil, hs...)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Headers) != len(hs) {
		t.Fatalf("headers %q", resp.Headers)
	}
	for i := range hs {
		if !bytes.Equal(resp.Headers[i], hs[i]) {
			t.Fatalf("header %d: %q, want %q", i, resp.Headers[i], hs[i])
		}
	}
	if got := c.Addr(); got != e.addr {
		t.Fatalf("Addr %q, want %q", got, e.addr)
	}
}

func TestEvents(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, nil)
	const n = 200
	for i := 0; i < n; i++ {
		if err := c.Event([]byte("notify"), [][]byte{[]byte("i"), []byte(strconv.Itoa(i))}, []byte("hello")); err != nil {
			t.Fatal(err)
		}
	}
	// Events for no handler, and a panicking event handler, are dropped
	// without harming the connection.
	if err := c.Event([]byte("nobody-listens"), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Event([]byte("panic"), nil, nil); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "all events delivered", 5*time.Second, func() bool { return e.events.Load() == n })
	last := e.lastEvt.Load()
	if string(last.Body) != "hello" || len(last.Headers) != 2 || last.RequestId != 0 {
		t.Fatalf("event as received: %+v", last)
	}
	// A 1 MiB event takes the zstd path.
	if err := c.Event([]byte("notify"), nil, bytes.Repeat([]byte("z"), 1<<20)); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "big event delivered", 5*time.Second, func() bool { return e.events.Load() == n+1 })
	if got := len(e.lastEvt.Load().Body); got != 1<<20 {
		t.Fatalf("big event body %d bytes", got)
	}
	if _, err := unary(c, 5*time.Second, "echo", []byte("still fine")); err != nil {
		t.Fatal(err)
	}
	if c.Stats().InFlight != 0 {
		t.Fatalf("events left calls in flight: %+v", c.Stats())
	}
}

func TestBodies(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, nil)
	rnd := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{0, 100, 4 << 10, 64 << 10, 4 << 20} {
		for _, random := range []bool{false, true} {
			body := bytes.Repeat([]byte("x"), n) // compressible: zstd past 16 KiB
			if random {
				for i := range body {
					body[i] = byte(rnd.Uint32())
				}
			}
			resp, err := unary(c, 10*time.Second, "echo", body, []byte("k"), []byte("v"))
			if err != nil {
				t.Fatalf("%d bytes (random %v): %v", n, random, err)
			}
			if !bytes.Equal(resp.Body, body) || resp.Code != 0 || len(resp.Headers) != 2 {
				t.Fatalf("%d bytes (random %v): code %d, %d bytes back, headers %q", n, random, resp.Code, len(resp.Body), resp.Headers)
			}
		}
	}
	// Over the frame limit: refused locally, the connection unharmed.
	_, err := unary(c, 5*time.Second, "echo", make([]byte, 17<<20))
	if !errors.Is(err, qrpc.ErrTooLarge) {
		t.Fatalf("17 MiB body: %v, want ErrTooLarge", err)
	}
	if _, err := unary(c, 5*time.Second, "echo", []byte("after")); err != nil {
		t.Fatal(err)
	}
}

func TestThousandConcurrentCallsOneConnection(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{Conns: 1, Streams: 8})
	const n = 1000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			body := []byte(strconv.Itoa(i))
			if i%50 == 0 {
				body = bytes.Repeat(body, 10000) // some zstd frames in the mix
			}
			resp, err := unary(c, 20*time.Second, "echo", body, []byte("i"), []byte(strconv.Itoa(i)))
			switch {
			case err != nil:
				errs <- fmt.Errorf("call %d: %w", i, err)
			case !bytes.Equal(resp.Body, body) || string(resp.Headers[1]) != strconv.Itoa(i):
				errs <- fmt.Errorf("call %d got the answer of another call: %q", i, resp.Headers)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s := c.Stats(); s.InFlight != 0 || s.Reconnects != 0 {
		t.Fatalf("stats after the burst: %+v", s)
	}
}

func TestDeadline(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, nil)
	began := time.Now()
	_, err := unary(c, 100*time.Millisecond, "sleep", []byte("400"))
	if !errors.Is(err, qrpc.ErrTimeout) {
		t.Fatalf("err %v, want ErrTimeout", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, qrpc.ErrTimeout) {
		t.Fatalf("err %v", err)
	}
	if d := time.Since(began); d > 350*time.Millisecond {
		t.Fatalf("timed out after %v, deadline was 100ms", d)
	}
	// The slot is freed at once, not when the late answer comes.
	if n := c.Stats().InFlight; n != 0 {
		t.Fatalf("InFlight %d right after the timeout", n)
	}
	// The late response arrives and is dropped quietly: the connection and
	// the stream it came on keep working. A dropped answer gives no event:
	// once the handler has returned (its answer goes out then), 64 more
	// round trips on the connection are the window it arrives in.
	testwait.Until(t, "the timed-out call's handler returns", 10*time.Second, func() bool { return e.sleeping.Load() == 0 })
	for i := 0; i < 64; i++ {
		if _, err := unary(c, 5*time.Second, "echo", []byte("x")); err != nil {
			t.Fatalf("after a late response: %v", err)
		}
	}
	if s := c.Stats(); s.InFlight != 0 || s.Reconnects != 0 {
		t.Fatalf("stats: %+v", s)
	}

	// Start with a deadline: done gets ErrTimeout from the client's own timer.
	got := make(chan error, 1)
	_, err = c.Start(&qrpc.Call{Method: []byte("sleep"), Body: []byte("300"), Deadline: time.Now().Add(50 * time.Millisecond)},
		func(_ *qrpc.Response, err error) { got <- err })
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, qrpc.ErrTimeout) {
			t.Fatalf("Start deadline: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Start deadline never fired")
	}
	// A deadline already passed fails at once too.
	_, err = c.Start(&qrpc.Call{Method: []byte("echo"), Deadline: time.Now().Add(-time.Second)},
		func(_ *qrpc.Response, err error) { got <- err })
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		// The answer may be read before the timer that fires at once has
		// run; it is past the deadline all the same.
		if !errors.Is(err, qrpc.ErrTimeout) {
			t.Fatalf("past deadline: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("call with a past deadline never finished")
	}
	testwait.Until(t, "InFlight back to 0", 2*time.Second, func() bool { return c.Stats().InFlight == 0 })
}

func TestCancel(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, nil)

	// Unary: cancelling the context returns at once with context.Canceled.
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		_, err := c.Unary(ctx, "block", nil)
		res <- err
	}()
	testwait.Until(t, "call in flight", 2*time.Second, func() bool { return c.Stats().InFlight == 1 })
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("cancel did not end the call")
	}
	if n := c.Stats().InFlight; n != 0 {
		t.Fatalf("InFlight %d after cancel", n)
	}

	// Start + Pending.Cancel: done is never called, the slot is freed, and
	// the response, when it comes, is dropped.
	called := make(chan struct{}, 1)
	p, err := c.Start(&qrpc.Call{Method: []byte("block")}, func(*qrpc.Response, error) { called <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	if !p.Cancel() {
		t.Fatal("Cancel of a pending call reported false")
	}
	if p.Cancel() {
		t.Fatal("second Cancel reported true")
	}
	if n := c.Stats().InFlight; n != 0 {
		t.Fatalf("InFlight %d after Pending.Cancel", n)
	}
	e.unblock() // the blocked handlers answer now
	if _, err := unary(c, 5*time.Second, "echo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
		t.Fatal("done called after Cancel")
	case <-time.After(200 * time.Millisecond):
	}

	// Cancel after completion reports false.
	fin := make(chan struct{})
	p, err = c.Start(&qrpc.Call{Method: []byte("echo")}, func(*qrpc.Response, error) { close(fin) })
	if err != nil {
		t.Fatal(err)
	}
	<-fin
	if p.Cancel() {
		t.Fatal("Cancel after done reported true")
	}
	var zero qrpc.Pending
	if zero.Cancel() {
		t.Fatal("zero Pending cancelled something")
	}
}

// TestStartDoneContract pins down the contract the FFI layer
// relies on: done runs once per call, resp is readable inside it, and the
// client reuses it afterwards (so done must copy).
func TestStartDoneContract(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{Streams: 1})
	const n = 500
	var calls atomic.Int64
	var wg sync.WaitGroup
	bad := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		body := []byte(strconv.Itoa(i))
		hdr := []byte("h")
		call := &qrpc.Call{Method: []byte("echo"), Body: body, Headers: [][]byte{hdr, body}}
		_, err := c.Start(call, func(resp *qrpc.Response, err error) {
			defer wg.Done()
			calls.Add(1)
			if err != nil || string(resp.Body) != strconv.Itoa(i) || string(resp.Headers[1]) != strconv.Itoa(i) {
				bad <- fmt.Sprintf("call %d: %v %q", i, err, resp.GetBody())
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		// Start copied what it needs: the caller may scribble at once.
		copy(body, "XXXXXXXX")
		hdr[0] = 'Z'
	}
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Error(b)
	}
	// One more call on the only stream: its answer comes after any
	// answer to the calls above, so a done run twice would have run by
	// the time it returns.
	if _, err := unary(c, 5*time.Second, "echo", nil); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != n {
		t.Fatalf("done ran %d times for %d calls", calls.Load(), n)
	}
}

func TestUnknownMethodKeepsStream(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{Streams: 1}) // every call on the same stream
	for i := 0; i < 3; i++ {
		resp, err := unary(c, 5*time.Second, "no-such-method", []byte("x"))
		if err != nil {
			t.Fatalf("unknown method is an answer, not an error: %v", err)
		}
		if resp.Code != qrpc.CodeUnknownMethod || !bytes.Contains(resp.Body, []byte("no-such-method")) {
			t.Fatalf("code %d body %q", resp.Code, resp.Body)
		}
		if _, err := unary(c, 5*time.Second, "echo", []byte("x")); err != nil {
			t.Fatalf("the stream died after an unknown method: %v", err)
		}
	}
	if s := c.Stats(); s.Reconnects != 0 {
		t.Fatalf("reconnected: %+v", s)
	}
}

func TestHandlerPanic(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{Streams: 1})
	for i := 0; i < 3; i++ {
		resp, err := unary(c, 5*time.Second, "panic", nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != qrpc.CodeInternal || len(resp.Body) == 0 || bytes.Contains(resp.Body, []byte("handler bug")) {
			t.Fatalf("code %d body %q (the panic value must not leak to the client)", resp.Code, resp.Body)
		}
		if resp, err := unary(c, 5*time.Second, "echo", []byte("alive")); err != nil || string(resp.Body) != "alive" {
			t.Fatalf("server after a panic: %v", err)
		}
	}
}

func TestCloseFailsPendingCalls(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{Conns: 2, Streams: 4})
	const n = 20
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		_, err := c.Start(&qrpc.Call{Method: []byte("block")}, func(_ *qrpc.Response, err error) { errs <- err })
		if err != nil {
			t.Fatal(err)
		}
	}
	testwait.Until(t, "calls in flight", 2*time.Second, func() bool { return c.Stats().InFlight == n })
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, qrpc.ErrClosed) {
				t.Fatalf("pending call ended with %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d of %d pending calls failed on Close", i, n)
		}
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs")
	}
	if _, err := unary(c, time.Second, "echo", nil); !errors.Is(err, qrpc.ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
	if _, err := c.Start(&qrpc.Call{Method: []byte("echo")}, func(*qrpc.Response, error) { t.Error("done after Close") }); !errors.Is(err, qrpc.ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
	if err := c.Event([]byte("notify"), nil, nil); !errors.Is(err, qrpc.ErrClosed) {
		t.Fatalf("Event after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestServerShutdownWaitsForHandlers: a graceful Shutdown lets a running
// handler answer before the connection closes.
func TestServerShutdownWaitsForHandlers(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, nil)
	res := make(chan error, 1)
	go func() {
		resp, err := unary(c, 5*time.Second, "sleep", []byte("300"))
		if err == nil && string(resp.Body) != "slept" {
			err = fmt.Errorf("body %q", resp.Body)
		}
		res <- err
	}()
	testwait.Until(t, "the handler running", 5*time.Second, func() bool { return e.sleeping.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("call running during Shutdown: %v", err)
	}
	// The port is free again at once.
	pc, err := net.ListenPacket("udp", e.addr)
	if err != nil {
		t.Fatalf("port still bound after Shutdown: %v", err)
	}
	_ = pc.Close()
}

// TestStartRacesFailure: calls started while the connection dies (server
// gone) or the client closes each finish exactly once; none is left hanging.
func TestStartRacesFailure(t *testing.T) {
	checkGoroutines(t)
	for _, closeClient := range []bool{false, true} {
		name := "connection lost"
		if closeClient {
			name = "client closed"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			c := e.dial(t, fastRedial())
			var started, finished, twice, attempts, running atomic.Int64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for g := 0; g < 8; g++ {
				wg.Add(1)
				running.Add(1)
				go func() {
					defer wg.Done()
					defer running.Add(-1)
					for i := 0; i < 20000; i++ {
						select {
						case <-stop:
							return
						default:
						}
						var once atomic.Bool
						attempts.Add(1)
						_, err := c.Start(&qrpc.Call{Method: []byte("block")}, func(*qrpc.Response, error) {
							if once.Swap(true) {
								twice.Add(1)
							}
							finished.Add(1)
						})
						if err == nil {
							started.Add(1)
						}
					}
				}()
			}
			testwait.Until(t, "calls started", 10*time.Second, func() bool { return started.Load() >= 100 })
			if closeClient {
				_ = c.Close()
			} else {
				// Handlers are blocked: a short grace, then the connections go.
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				_ = e.srv.Shutdown(ctx)
				cancel()
			}
			// Calls go on starting across the failure: the race under test,
			// over the next 100 attempts (started or refused), or until the
			// starters have made all theirs.
			progress(t, "attempts after the failure", attempts.Load, 100, 10*time.Second,
				func() bool { return running.Load() == 0 })
			close(stop)
			wg.Wait()
			if !closeClient {
				_ = c.Close() // fails whatever a new connection has in flight
			}
			testwait.Until(t, "every started call finished", 5*time.Second, func() bool { return finished.Load() == started.Load() })
			if twice.Load() != 0 {
				t.Fatalf("%d calls finished twice", twice.Load())
			}
			if started.Load() == 0 {
				t.Fatal("no call started before the failure")
			}
			t.Logf("%d calls started, all finished", started.Load())
		})
	}
}
