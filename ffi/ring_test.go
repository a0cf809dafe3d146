package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
)

// cmem hands out C copies of strings, as Lua's strings are C memory to
// the library: Go memory must not be stored in the C ring.
type cmem struct{ ps []unsafe.Pointer }

func (m *cmem) str(s string) (unsafe.Pointer, uintptr) {
	if s == "" {
		return nil, 0
	}
	p := cMalloc(len(s))
	copy(cBuf(p, len(s)), s)
	m.ps = append(m.ps, p)
	return p, uintptr(len(s))
}

func (m *cmem) free() {
	for _, p := range m.ps {
		cFree(p)
	}
	m.ps = nil
}

// unary is a UNARY command whose strings are C copies.
func (m *cmem) unary(conn, id uint64, method, body string, hdrs ...string) *cmdABI {
	c := &cmdABI{Version: cmdVersion, Op: opUnary, Conn: conn, CallID: id, NHdrs: uint32(len(hdrs))}
	c.Method, c.MethodLen = m.str(method)
	c.Body, c.BodyLen = m.str(body)
	c.Hdrs, c.HdrsLen = m.str(string(packHeaders(hdrs...)))
	return c
}

func TestSubmitRing(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	d := openBuiltin(t)
	h := d.connect(1, ts.Addr, ts.CA.CertPEM).handle
	var m cmem
	t.Cleanup(m.free)

	t.Run("every call completes once with its own body and headers", func(t *testing.T) {
		const n = 2000
		start := sqConsumed()
		for i := uint64(0); i < n; i++ {
			id := 1000 + i
			cmd := m.unary(h, id, "echo", fmt.Sprintf("body-%d-%s", id, strings.Repeat("x", int(i%300))), "x-id", fmt.Sprint(id))
			cmd.TimeoutMS = 10000
			for {
				rc := sqSubmit(cmd)
				if rc == statusPending {
					break
				}
				if rc != errFull {
					t.Fatalf("submit %d: %d", id, rc)
				}
				d.pump(time.Millisecond) // the consumer is behind: let it catch up
			}
		}
		for i := uint64(0); i < n; i++ {
			id := 1000 + i
			r := d.wait(id, 10*time.Second)
			if r.status != statusOK {
				t.Fatalf("call %d: status %d %q", id, r.status, r.text())
			}
			_, hdrs, body := readResult(t, cBuf(r.data, r.n))
			want := fmt.Sprintf("body-%d-%s", id, strings.Repeat("x", int(i%300)))
			if string(body) != want || strings.Join(hdrs, "=") != fmt.Sprintf("x-id=%d", id) {
				t.Fatalf("call %d: body %q headers %q", id, body, hdrs)
			}
		}
		if got := sqConsumed() - start; got != n {
			t.Fatalf("consumed %d commands, want %d", got, n)
		}
	})

	t.Run("errors found later arrive as completions", func(t *testing.T) {
		if rc := sqSubmit(m.unary(987654, 5000, "echo", "x")); rc != statusPending {
			t.Fatalf("submit: %d", rc)
		}
		r := d.wait(5000, 5*time.Second)
		if r.status != errClosed {
			t.Fatalf("unknown handle: status %d %q, want %d", r.status, r.text(), errClosed)
		}
		bad := m.unary(h, 5001, "echo", "x")
		bad.Version = 99
		if rc := sqSubmit(bad); rc != statusPending {
			t.Fatalf("submit: %d", rc)
		}
		if r := d.wait(5001, 5*time.Second); r.status != errBadArg || !strings.Contains(r.text(), "version") {
			t.Fatalf("bad version: status %d %q", r.status, r.text())
		}
	})

	t.Run("a cancel follows its call through the ring", func(t *testing.T) {
		cmd := m.unary(h, 6000, "sleep", "3000")
		cmd.TimeoutMS = 10000
		cancel := &cmdABI{Version: cmdVersion, Op: opCancel, Conn: h, CallID: 6000}
		// Back to back: the cancel must not overtake the call it cancels.
		if rc := sqSubmit(cmd); rc != statusPending {
			t.Fatalf("submit: %d", rc)
		}
		if rc := sqSubmit(cancel); rc != statusPending {
			t.Fatalf("cancel: %d", rc)
		}
		waitFor(t, func() bool {
			s, err := builtin.stats(h)
			return err == nil && s.Inflight == 0
		}, "the cancelled call to leave the connection")
		d.pump(300 * time.Millisecond)
		if c, ok := d.got[6000]; ok {
			t.Fatalf("a cancelled call completed: status %d %q", c.status, c.text())
		}
	})

	t.Run("a full ring refuses, then drains", func(t *testing.T) {
		// Hold the consumer inside its first command: nothing is released.
		release := make(chan struct{})
		var once sync.Once
		entered := make(chan struct{})
		testHook = func(where string) {
			if where == "submit" {
				once.Do(func() { close(entered) })
				<-release
			}
		}
		t.Cleanup(func() { testHook = nil })
		echo := func(id uint64) *cmdABI {
			c := &cmdABI{Version: cmdVersion, Op: opEcho, CallID: id}
			c.Body, c.BodyLen = m.str("e")
			return c
		}
		if rc := sqSubmit(echo(7000)); rc != statusPending {
			t.Fatalf("submit: %d", rc)
		}
		<-entered
		accepted := 1
		for ; accepted < 2*sqCap; accepted++ {
			rc := sqSubmit(echo(7000 + uint64(accepted)))
			if rc == errFull {
				break
			}
			if rc != statusPending {
				t.Fatalf("submit %d: %d", accepted, rc)
			}
		}
		if accepted != sqCap {
			t.Fatalf("the ring took %d commands, want QRPC_SQ_CAP = %d", accepted, sqCap)
		}
		testHook = nil
		close(release)
		for i := 0; i < accepted; i++ {
			if r := d.wait(7000+uint64(i), 10*time.Second); r.status != statusOK {
				t.Fatalf("echo %d: status %d", i, r.status)
			}
		}
	})

	t.Run("a panic in a queued command is its error completion", func(t *testing.T) {
		testHook = func(where string) {
			if where == "submit" {
				panic("injected in a queued command")
			}
		}
		t.Cleanup(func() { testHook = nil })
		if rc := sqSubmit(m.unary(h, 8500, "echo", "x")); rc != statusPending {
			t.Fatalf("submit: %d", rc)
		}
		r := d.wait(8500, 5*time.Second)
		if r.status != errGeneric || !strings.Contains(r.text(), "injected in a queued command") {
			t.Fatalf("status %d %q", r.status, r.text())
		}
		testHook = nil
		// The consumer survived it.
		if rc := sqSubmit(m.unary(h, 8501, "echo", "after")); rc != statusPending {
			t.Fatalf("submit: %d", rc)
		}
		if r := d.wait(8501, 5*time.Second); r.status != statusOK {
			t.Fatalf("after the panic: status %d %q", r.status, r.text())
		}
	})

	t.Run("closed after shutdown", func(t *testing.T) {
		builtin.shutdown()
		if rc := sqSubmit(m.unary(h, 8000, "echo", "x")); rc != errClosed {
			t.Fatalf("submit after shutdown: %d, want %d", rc, errClosed)
		}
	})
}
