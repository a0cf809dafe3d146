package bridge

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// These tests run the runtime without cgo: Go memory stands in for C's
// malloc (every allocation must be freed exactly once), a channel for the
// host's completion queue, and a real qrpc server answers over QUIC on
// 127.0.0.1. ffi/ tests the hosts and the exports on top.

// goMemory is a Memory that checks ownership: Free of an unknown pointer
// (a double free) fails the test, and what is still allocated at the end
// is reported as a leak.
type goMemory struct {
	t    testing.TB
	mu   sync.Mutex
	live map[unsafe.Pointer][]byte
	fail bool // Alloc returns nil, as malloc does when memory runs out
}

func newGoMemory(t testing.TB) *goMemory {
	m := &goMemory{t: t, live: map[unsafe.Pointer][]byte{}}
	t.Cleanup(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(m.live) != 0 {
			t.Errorf("%d allocations never freed", len(m.live))
		}
	})
	return m
}

func (m *goMemory) Alloc(n int) unsafe.Pointer {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return nil
	}
	b := make([]byte, max(n, 1))
	p := unsafe.Pointer(&b[0])
	m.live[p] = b
	return p
}

func (m *goMemory) Free(p unsafe.Pointer) {
	if p == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.live[p]; !ok {
		m.t.Errorf("free of %p, which is not allocated", p)
	}
	delete(m.live, p)
}

// testHost is a Host whose completions go to a channel.
type testHost struct {
	t      testing.TB
	r      *Runtime
	gen    *Gen
	closed bool // Gen reports the host closed
	calls  *Calls
	out    chan Completion
	got    map[uint64]Completion
}

func newTestHost(t testing.TB, r *Runtime, cancellable bool) *testHost {
	h := &testHost{t: t, r: r, gen: NewGen(), out: make(chan Completion, 1024), got: map[uint64]Completion{}}
	if cancellable {
		h.calls = &Calls{}
	}
	t.Cleanup(func() {
		r.EndGen(h.gen, h.calls, true)
		for _, c := range h.got {
			r.Free(&c)
		}
		for {
			select {
			case c := <-h.out:
				r.Free(&c)
			case <-time.After(200 * time.Millisecond):
				return
			}
		}
	})
	return h
}

func (h *testHost) Gen() (*Gen, error) {
	if h.closed {
		return nil, errors.New("closed: test host")
	}
	return h.gen, nil
}
func (h *testHost) Calls() *Calls         { return h.calls }
func (h *testHost) Complete(c Completion) { h.out <- c }

// submit runs cmd and wants status back.
func (h *testHost) submit(cmd Command, status int32) string {
	h.t.Helper()
	st, msg := h.r.Submit(h, &cmd)
	if st != status {
		h.t.Fatalf("op %d: status %d %q, want %d", cmd.Op, st, msg, status)
	}
	return msg
}

// wait returns call id's completion (freed at the end of the test).
func (h *testHost) wait(id uint64, within time.Duration) Completion {
	h.t.Helper()
	deadline := time.After(within)
	for {
		if c, ok := h.got[id]; ok {
			delete(h.got, id)
			h.t.Cleanup(func() { h.r.Free(&c) })
			return c
		}
		select {
		case c := <-h.out:
			if _, dup := h.got[c.CallID]; dup {
				h.t.Errorf("second completion for call %d", c.CallID)
			}
			h.got[c.CallID] = c
		case <-deadline:
			h.t.Fatalf("no completion for call %d within %v", id, within)
		}
	}
}

func text(c Completion) string { return string(Bytes(c.Data, int(c.Len))) }

// result decodes a completion's blob; headers are joined with "|".
func result(t testing.TB, c Completion) (uint32, string, []byte) {
	t.Helper()
	code, hdrs, body, err := ParseResult(Bytes(c.Data, int(c.Len)))
	if err != nil {
		t.Fatal(err)
	}
	hs := make([]string, len(hdrs))
	for i, h := range hdrs {
		hs[i] = string(h)
	}
	return code, strings.Join(hs, "|"), body
}

func (h *testHost) connect(id uint64, ts *testsrv.Server) uint64 {
	h.t.Helper()
	h.submit(Command{Op: OpConnect, CallID: id, TimeoutMS: 3000, Addr: []byte(ts.Addr), CA: ts.CA.CertPEM}, StatusPending)
	c := h.wait(id, 10*time.Second)
	if c.Status != StatusOK || c.Handle == 0 {
		h.t.Fatalf("connect: %d %q", c.Status, text(c))
	}
	return c.Handle
}

func unary(conn, id uint64, method, body string, timeoutMS int32, hdrs ...string) Command {
	return Command{Op: OpUnary, Conn: conn, CallID: id, TimeoutMS: timeoutMS, Method: []byte(method), Body: []byte(body),
		Hdrs: PackHeaders(hdrs...), NHdrs: uint32(len(hdrs))}
}

func TestRuntimeCommands(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	r := New(newGoMemory(t), nil)
	h := newTestHost(t, r, true)
	conn := h.connect(1, ts)

	h.submit(unary(conn, 2, "echo", "hello", 5000, "x-id", "7"), StatusPending)
	if code, hdrs, body := result(t, h.wait(2, 5*time.Second)); code != 0 || hdrs != "x-id|7" || string(body) != "hello" {
		t.Fatalf("echo: code %d headers %q body %q", code, hdrs, body)
	}
	h.submit(unary(conn, 3, "code", "", 5000), StatusPending)
	if code, _, body := result(t, h.wait(3, 5*time.Second)); code != 7 || string(body) != "seven" {
		t.Fatalf("code: %d %q", code, body)
	}

	// Go enforces the deadline.
	h.submit(unary(conn, 4, "sleep", "2000", 100), StatusPending)
	if c := h.wait(4, 5*time.Second); c.Status != ErrTimeout || text(c) != "timeout" {
		t.Fatalf("timeout: %d %q", c.Status, text(c))
	}

	// CANCEL: no completion, nothing left in flight or in the table.
	slept := ts.Slept()
	h.submit(unary(conn, 5, "sleep", "300", 5000), StatusPending)
	if s, _ := r.Stats(conn, 0); s.Inflight != 1 {
		t.Fatalf("in flight before cancel: %d", s.Inflight)
	}
	h.submit(Command{Op: OpCancel, CallID: 5}, StatusOK)
	if s, _ := r.Stats(conn, 0); s.Inflight != 0 || h.calls.Len() != 0 {
		t.Fatalf("after cancel: %d in flight, %d in the table", s.Inflight, h.calls.Len())
	}
	// Past the handler's answer: the server has written it, and 3 more
	// calls on the connection have been answered after (wait records any
	// other completion it drains, the cancelled call's included).
	testwait.Until(t, "the cancelled call's handler answers", 5*time.Second, func() bool { return ts.Slept() >= slept+1 })
	for i := uint64(0); i < 3; i++ {
		h.submit(unary(conn, 50+i, "echo", "after", 5000), StatusPending)
		h.wait(50+i, 5*time.Second)
	}
	if c, ok := h.got[5]; ok {
		t.Fatalf("completion %d after CANCEL", c.CallID)
	}

	// A call id in flight cannot be reused.
	h.submit(unary(conn, 6, "sleep", "200", 5000), StatusPending)
	if msg := h.submit(unary(conn, 6, "echo", "", 5000), ErrBadArg); !strings.Contains(msg, "already in flight") {
		t.Fatalf("duplicate call id: %q", msg)
	}
	h.wait(6, 5*time.Second)

	// Events are synchronous and reach the server.
	for i := 0; i < 3; i++ {
		ev := unary(conn, 0, "ev", "e", 0)
		ev.Op = OpEvent
		h.submit(ev, StatusOK)
	}
	testwait.For(5*time.Second, func() bool { return ts.Events("ev") >= 3 })
	if n := ts.Events("ev"); n != 3 {
		t.Fatalf("server got %d events", n)
	}

	// ECHO completes through the host at once.
	h.submit(Command{Op: OpEcho, CallID: 7, Body: []byte("echo body")}, StatusPending)
	if _, _, body := result(t, h.wait(7, time.Second)); string(body) != "echo body" {
		t.Fatalf("echo op: %q", body)
	}
	if s, err := r.Stats(conn, 0); err != nil || s.Inflight != 0 || s.Calls != 8 || s.Events != 3 { // 5 and the 3 echoes after CANCEL
		t.Fatalf("stats %+v %v", s, err)
	}

	// CLOSE: the pending call completes with "closed", later ones fail at once.
	h.submit(unary(conn, 9, "sleep", "5000", 10000), StatusPending)
	h.submit(Command{Op: OpClose, Conn: conn}, StatusOK)
	if c := h.wait(9, 5*time.Second); c.Status != ErrClosed || text(c) != "closed" {
		t.Fatalf("pending call at close: %d %q", c.Status, text(c))
	}
	if msg := h.submit(unary(conn, 10, "echo", "", 0), ErrClosed); msg != "closed" {
		t.Fatalf("unary on a closed handle: %q", msg)
	}
	h.submit(Command{Op: OpClose, Conn: conn}, ErrClosed)
	if s, _ := r.Stats(0, 0); s.Inflight != 0 || r.Conns() != 0 {
		t.Fatalf("at the end: %+v, %d connections", s, r.Conns())
	}

	// A malformed command and a closed host are refused before anything runs.
	if msg := h.submit(unary(conn, 11, "", "", 0), ErrBadArg); msg != "bad command: empty method" {
		t.Fatalf("empty method: %q", msg)
	}
	h.closed = true
	if msg := h.submit(unary(conn, 12, "echo", "", 0), ErrClosed); msg != "closed: test host" {
		t.Fatalf("closed host: %q", msg)
	}
}

func TestEndGen(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	r := New(newGoMemory(t), nil)
	cancellable := newTestHost(t, r, true)
	plain := newTestHost(t, r, false)
	c1, c2 := cancellable.connect(1, ts), plain.connect(1, ts)
	// The calls sleep far longer than the test takes, even on a machine
	// that stands still for seconds: only EndGen ends them.
	for id := uint64(2); id < 6; id++ {
		cancellable.submit(unary(c1, id, "sleep", "60000", 90000), StatusPending)
		plain.submit(unary(c2, id, "sleep", "60000", 90000), StatusPending)
	}
	// CANCEL on a host without a call table does nothing.
	plain.submit(Command{Op: OpCancel, CallID: 2}, StatusOK)
	if s, _ := r.Stats(0, 0); s.Inflight != 8 {
		t.Fatalf("%d in flight", s.Inflight)
	}

	r.EndGen(cancellable.gen, cancellable.calls, true)
	if s, _ := r.Stats(0, 0); s.Inflight != 4 || r.Conns() != 1 {
		t.Fatalf("after the first host ended: %d in flight, %d connections", s.Inflight, r.Conns())
	}
	// Its calls were cancelled: no completion; it cannot dial any more.
	cancellable.submit(Command{Op: OpConnect, CallID: 9, TimeoutMS: 3000, Addr: []byte(ts.Addr), CA: ts.CA.CertPEM}, StatusPending)
	if c := cancellable.wait(9, 5*time.Second); c.Status != ErrClosed {
		t.Fatalf("dial after the end: %d %q", c.Status, text(c))
	}
	if len(cancellable.got) != 0 || len(cancellable.out) != 0 {
		t.Fatal("completions for cancelled calls")
	}

	// The other host's calls complete with "closed" when it ends.
	r.EndGen(plain.gen, nil, true)
	for id := uint64(2); id < 6; id++ {
		if c := plain.wait(id, 5*time.Second); c.Status != ErrClosed {
			t.Fatalf("call %d: %d %q", id, c.Status, text(c))
		}
	}
	if s, _ := r.Stats(0, 0); s.Inflight != 0 || r.Conns() != 0 {
		t.Fatalf("at the end: %d in flight, %d connections", s.Inflight, r.Conns())
	}
}
