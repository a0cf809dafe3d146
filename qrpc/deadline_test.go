package qrpc_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// A response read after the call's deadline, before the deadline's timer
// ran (timers run late on a loaded machine: issue 12 saw 11 answers in
// 20,000 calls with a 5 ms timeout), is a timeout, never the answer. The
// clock the check reads is moved past a deadline an hour away, so the
// timer cannot fire and the order is fixed.
func TestResponseAfterDeadlineIsTimeout(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, nil)
	deadline := time.Now().Add(time.Hour)
	start := func() error {
		t.Helper()
		got := make(chan error, 1)
		_, err := c.Start(&qrpc.Call{Method: []byte("echo"), Body: []byte("x"), Deadline: deadline},
			func(_ *qrpc.Response, err error) { got <- err })
		if err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("the call never finished")
		}
		return nil
	}

	if err := start(); err != nil {
		t.Fatalf("before the deadline: %v", err)
	}
	restore := qrpc.SetClockForTest(func() time.Time { return deadline.Add(time.Millisecond) })
	defer restore()
	if err := start(); !errors.Is(err, qrpc.ErrTimeout) {
		t.Fatalf("response after the deadline: %v, want ErrTimeout", err)
	}
	restore()
	if err := start(); err != nil {
		t.Fatalf("clock restored: %v", err)
	}
	if n := c.Stats().InFlight; n != 0 {
		t.Fatalf("InFlight %d", n)
	}
}
