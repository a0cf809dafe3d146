//go:build qrpctesthooks

package bridge

import (
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
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
