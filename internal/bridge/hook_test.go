//go:build qrpctesthooks

package bridge

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

func TestPanicWhileCompleting(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	var sink lineSink
	r := New(newGoMemory(t), sink.take)
	h := newTestHost(t, r, true)
	conn := h.connect(1, ts)
	t.Cleanup(func() { SetTestHook(nil) })
	SetTestHook(func(where string) {
		if where == "complete" {
			panic("injected in complete")
		}
	})
	h.submit(unary(conn, 2, "echo", "x", 5000), StatusPending)
	if c := h.wait(2, 5*time.Second); c.Status != ErrGeneric || text(c) != "internal error" {
		t.Fatalf("completion after a panic: %d %q", c.Status, text(c))
	}
	SetTestHook(nil)
	h.submit(unary(conn, 3, "echo", "x", 5000), StatusPending)
	if c := h.wait(3, 5*time.Second); c.Status != StatusOK {
		t.Fatalf("after the panic: %d %q", c.Status, text(c))
	}
	if s, _ := r.Stats(0, 0); s.Inflight != 0 {
		t.Fatalf("%d in flight", s.Inflight)
	}
	found := false
	for _, l := range sink.all() {
		found = found || strings.HasPrefix(l, "4 qrpc: panic recovered where=complete panic=\"injected in complete\" stack=\"internal/bridge.TestPanicWhileCompleting")
	}
	if !found {
		t.Fatalf("no panic line in %q", sink.all())
	}
}

// panicHost is a test host whose Complete panics the first n times,
// before it takes the completion.
type panicHost struct {
	*testHost
	n atomic.Int32
}

func (p *panicHost) Complete(c Completion) {
	if p.n.Add(-1) >= 0 {
		panic("injected in the host's Complete")
	}
	p.testHost.Complete(c)
}

// TestConnectPanicAfterSuccess: a CONNECT whose dial succeeded and whose
// handle then does not reach the host (a panic on the way, or in the
// host's Complete) completes with "internal error" and leaves no
// connection behind: nothing else knows its handle. The next CONNECT
// works.
func TestConnectPanicAfterSuccess(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	for _, c := range []struct {
		name     string
		hook     bool  // panic between the dial and the completion
		complete int32 // Completes that panic
	}{{"after success", true, 0}, {"in Complete", false, 1}} {
		t.Run(c.name, func(t *testing.T) {
			r := New(newGoMemory(t), nil)
			th := newTestHost(t, r, true)
			h := &panicHost{testHost: th}
			h.n.Store(c.complete)
			t.Cleanup(func() { SetTestHook(nil) })
			if c.hook {
				SetTestHook(func(where string) {
					if where == "connect after success" {
						panic("injected after success")
					}
				})
			}
			cmd := Command{Op: OpConnect, CallID: 1, TimeoutMS: 3000, Addr: []byte(ts.Addr), CA: ts.CA.CertPEM}
			if st, msg := r.Submit(h, &cmd); st != StatusPending {
				t.Fatalf("connect: %d %q", st, msg)
			}
			if got := th.wait(1, 10*time.Second); got.Status != ErrGeneric || text(got) != "internal error" {
				t.Fatalf("connect with a panic after its dial: %d %q", got.Status, text(got))
			}
			testwait.Until(t, "the connection closed", 10*time.Second, func() bool { return r.Conns() == 0 })
			SetTestHook(nil)
			th.connect(2, ts)
		})
	}
}
