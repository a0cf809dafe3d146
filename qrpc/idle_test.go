package qrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestIdleConnectionStaysOpen: a connection left idle for four of its idle
// timeouts is still the same connection on the next call: keep-alives
// (every half of the idle timeout) kept it open, no re-dial was needed.
func TestIdleConnectionStaysOpen(t *testing.T) {
	t.Parallel()
	const idle = 600 * time.Millisecond
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{IdleTimeout: idle})
	if _, err := c.Unary(t.Context(), "echo", []byte("before")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * idle) // the scenario: a connection idle for 4 idle timeouts
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	r, err := c.Unary(ctx, "echo", []byte("after"))
	if err != nil || string(r.Body) != "after" {
		t.Fatalf("the call after the idle time: %v %v", r, err)
	}
	if n := c.Stats().Reconnects; n != 0 {
		t.Errorf("%d re-dials: the idle connection was closed", n)
	}
}
