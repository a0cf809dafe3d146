package qrpc_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Events sent just before Close must all reach the server: Close closes the
// send side and waits for the server to confirm it has read everything.
func TestCloseDeliversQueuedEvents(t *testing.T) {
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{CloseLinger: 10 * time.Second})
	const n = 300
	big := bytes.Repeat([]byte("e"), 64<<10) // enough to outrun flow control and use the flusher
	for i := 0; i < n; i++ {
		body := []byte("small")
		if i%3 == 0 {
			body = big
		}
		if err := c.Event([]byte("notify"), nil, body); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The server's confirmation, not the 10 s linger, must have ended Close.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close waited %v: the server never confirmed", d)
	}
	testwait.Until(t, "all events delivered", 2*time.Second, func() bool { return e.events.Load() == n })
	if err := c.Event([]byte("notify"), nil, nil); !errors.Is(err, qrpc.ErrClosed) {
		t.Fatalf("event after Close: %v, want ErrClosed", err)
	}
}

// Calls in flight when Close starts may complete during the linger; none
// hangs, and each ends with a response or ErrClosed.
func TestCloseWithCallsInFlight(t *testing.T) {
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{CloseLinger: 200 * time.Millisecond})
	results := make(chan error, 20)
	for i := 0; i < 20; i++ {
		_, err := c.Start(&qrpc.Call{Method: []byte("sleep"), Body: []byte("50")}, func(_ *qrpc.Response, err error) {
			results <- err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		select {
		case err := <-results:
			if err != nil && !errors.Is(err, qrpc.ErrClosed) {
				t.Fatalf("call %d: %v", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("call %d never finished", i)
		}
	}
}
