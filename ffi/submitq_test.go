package main

import (
	"runtime"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
)

// pushAsync queues c with qrpc_submit_async. cgo refuses a struct that
// holds unpinned Go pointers, so its strings are pinned for the call (the
// queue copies them before it returns).
func pushAsync(c *cmdABI) int32 {
	var p runtime.Pinner
	defer p.Unpin()
	for _, f := range []*byte{(*byte)(c.Method), (*byte)(c.Body), (*byte)(c.Hdrs), (*byte)(c.HashKey), (*byte)(c.Addr), (*byte)(c.CA)} {
		if f != nil {
			p.Pin(f)
		}
	}
	return submitAsync(c)
}

func TestSubmitQueue(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	d := openBuiltin(t)
	h := d.connect(1, ts.Addr, ts.CA.CertPEM).Handle

	t.Run("unary", func(t *testing.T) {
		c := unaryCmd(h, "echo", "hello", "x-id", "7")
		c.CallID = 10
		if st := pushAsync(c); st != bridge.StatusPending {
			t.Fatalf("push: %d", st)
		}
		got := d.wait(10, 10*time.Second)
		if got.Status != bridge.StatusOK {
			t.Fatalf("status %d: %s", got.Status, text(got))
		}
		if _, hdrs, body := readResult(t, got); string(body) != "hello" || len(hdrs) != 2 || hdrs[1] != "7" {
			t.Fatalf("result %q %q", hdrs, body)
		}
	})

	t.Run("refusal is the completion", func(t *testing.T) {
		c := unaryCmd(h+1000, "echo", "x")
		c.CallID = 11
		if st := pushAsync(c); st != bridge.StatusPending {
			t.Fatalf("push: %d", st)
		}
		got := d.wait(11, 10*time.Second)
		if got.Status != bridge.ErrClosed || text(got) != "closed" {
			t.Fatalf("got %d %q, want closed", got.Status, text(got))
		}
		c = unaryCmd(h, "", "x")
		c.CallID = 12
		pushAsync(c)
		// the same message as qrpc_submit's
		_, want := submit(c)
		if got := d.wait(12, 10*time.Second); got.Status != bridge.ErrBadArg || text(got) != want {
			t.Fatalf("got %d %q, want %q", got.Status, text(got), want)
		}
	})

	t.Run("cancel queued after its call", func(t *testing.T) {
		c := unaryCmd(h, "sleep", "3000")
		c.CallID = 13
		pushAsync(c)
		x := &cmdABI{Version: bridge.CmdVersion, Op: bridge.OpCancel, Conn: h, CallID: 13}
		if st := pushAsync(x); st != bridge.StatusOK {
			t.Fatalf("cancel: %d", st)
		}
		waitFor(t, func() bool { return builtin.calls.Len() == 0 }, "the call to be forgotten")
		d.pump(500 * time.Millisecond)
		if got, ok := d.got[13]; ok {
			t.Fatalf("a cancelled call completed: %d %q", got.Status, text(got))
		}
	})

	t.Run("other ops refused", func(t *testing.T) {
		if st := pushAsync(connectCmd(14, ts.Addr, nil)); st != bridge.ErrBadArg {
			t.Fatalf("connect through the queue: %d", st)
		}
	})
}

func TestSubmitQueueClosed(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	d := openBuiltin(t)
	h := d.connect(1, ts.Addr, ts.CA.CertPEM).Handle
	builtin.shutdown()
	c := unaryCmd(h, "echo", "x")
	if st := pushAsync(c); st != bridge.ErrClosed {
		t.Fatalf("push after shutdown: %d, want closed", st)
	}
	// and open again with the next init
	d = openBuiltin(t)
	h = d.connect(2, ts.Addr, ts.CA.CertPEM).Handle
	c = unaryCmd(h, "echo", "again")
	c.CallID = 3
	if st := pushAsync(c); st != bridge.StatusPending {
		t.Fatalf("push after re-init: %d", st)
	}
	if got := d.wait(3, 10*time.Second); got.Status != bridge.StatusOK {
		t.Fatalf("status %d: %s", got.Status, text(got))
	}
}
