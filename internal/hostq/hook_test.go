//go:build qrpctesthooks

package hostq

import (
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge/cmdtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
)

func TestPanicsBecomeErrors(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	d := openBuiltin(t)
	h := d.connect(1, ts.Addr, ts.CA.CertPEM).Handle
	t.Cleanup(func() { bridge.SetTestHook(nil) })

	// In the submitter: the call completes with "internal error" (a panic
	// in an export is ffi/'s test).
	bridge.SetTestHook(func(where string) {
		if where == "submit" {
			panic("injected in submit")
		}
	})
	cmd := cmdtest.Unary(h, "echo", "x")
	cmd.CallID = 2
	if st := pushAsync(cmd); st != bridge.StatusPending {
		t.Fatalf("push: %d", st)
	}
	if r := d.wait(2, 5*time.Second); r.Status != bridge.ErrGeneric || text(r) != "internal error" {
		t.Fatalf("completion after a panic in the submitter: %d %q", r.Status, text(r))
	}

	// On qrpc's reader goroutine, while completing: the call still
	// completes, with "internal error".
	bridge.SetTestHook(func(where string) {
		if where == "complete" {
			panic("injected in complete")
		}
	})
	cmd.CallID = 3
	if st, msg := submit(cmd); st != bridge.StatusPending {
		t.Fatalf("submit: %d %s", st, msg)
	}
	r := d.wait(3, 5*time.Second)
	if r.Status != bridge.ErrGeneric || text(r) != "internal error" {
		t.Fatalf("completion after a panic: %d %q", r.Status, text(r))
	}
	bridge.SetTestHook(nil)
	// The connection survived.
	cmd.CallID = 4
	submit(cmd)
	if r := d.wait(4, 5*time.Second); r.Status != bridge.StatusOK {
		t.Fatalf("after the panics: %d %q", r.Status, text(r))
	}
	if s, _ := rt.Stats(0, builtin.Queued()); s.Inflight != 0 {
		t.Fatalf("%d in flight", s.Inflight)
	}
	// The panics were logged through the queue.
	found := 0
	for _, l := range d.logs {
		if strings.HasPrefix(l, "4 qrpc: panic") {
			found++
		}
	}
	if found != 2 {
		t.Fatalf("panic log lines: %q", d.logs)
	}
}
