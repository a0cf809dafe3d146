package qrpc_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// A response read after the call's deadline, before the deadline's timer
// ran (timers run late on a loaded machine: 11 answers in 20,000 calls
// with a 5 ms timeout were seen), is a timeout, never the answer. The
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
	restore := qrpc.SetClockForTest(c, func() time.Time { return deadline.Add(time.Millisecond) })
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

// The connection's deadline heaps hold the calls in flight and nothing
// more: 500 answered calls leave only the blocked ones with an hour to go,
// their cancels leave none. And a short deadline behind those hour-long
// ones still fires on time: the timer re-arms for an earlier deadline.
func TestDeadlinesHoldOnlyCallsInFlight(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	c := e.dial(t, nil)
	defer close(e.release)

	// One connection numbers its calls in sequence: this many consecutive
	// calls arm every shard's timer for an hour from now.
	const shards = qrpc.DeadlineShards
	var blocked []qrpc.Pending
	for range shards {
		p, err := c.Start(&qrpc.Call{Method: []byte("block"), Deadline: time.Now().Add(time.Hour)},
			func(*qrpc.Response, error) { t.Error("a blocked call finished") })
		if err != nil {
			t.Fatal(err)
		}
		blocked = append(blocked, p)
	}

	// Answered 1200 ms later: by then a deadline that did not fire would
	// show as "response came ... after the deadline" instead.
	got := make(chan error, 1)
	start := time.Now()
	if _, err := c.Start(&qrpc.Call{Method: []byte("sleep"), Body: []byte("1200"), Deadline: start.Add(50 * time.Millisecond)},
		func(_ *qrpc.Response, err error) { got <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, qrpc.ErrTimeout) || !strings.Contains(err.Error(), "no response within") {
			t.Fatalf("short deadline: %v, want the deadline's own ErrTimeout", err)
		}
		if el := time.Since(start); el < 50*time.Millisecond {
			t.Fatalf("short deadline fired after %v, before it was due", el)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the 50 ms deadline never fired")
	}

	const calls, window = 500, 64
	slots := make(chan struct{}, window)
	errs := make(chan error, calls)
	for i := 0; i < calls; i++ {
		slots <- struct{}{}
		_, err := c.Start(&qrpc.Call{Method: []byte("echo"), Body: []byte("x"), Deadline: time.Now().Add(10 * time.Second)},
			func(_ *qrpc.Response, err error) { errs <- err; <-slots })
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < calls; i++ {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d calls answered", i, calls)
		}
	}
	if n := qrpc.DeadlinesForTest(c); n != shards {
		t.Fatalf("deadline heaps hold %d calls, want %d (the blocked ones)", n, shards)
	}
	for _, p := range blocked {
		if !p.Cancel() {
			t.Fatal("a blocked call was not pending")
		}
	}
	if n := qrpc.DeadlinesForTest(c); n != 0 {
		t.Fatalf("deadline heaps hold %d calls after the cancel", n)
	}
}
