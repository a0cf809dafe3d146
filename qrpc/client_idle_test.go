package qrpc_test

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// streamReaders counts the goroutines reading a client stream's answers.
func streamReaders() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			readers := 0
			for _, g := range bytes.Split(buf[:n], []byte("\n\n")) {
				if bytes.Contains(g, []byte("qrpc.(*cstream).readLoop")) {
					readers++
				}
			}
			return readers
		}
		buf = make([]byte, 2*len(buf))
	}
}

// A stream's reader starts with its first frame: a connection whose calls
// used one of its 32 streams keeps one reader (an idle worker keeps no
// stack for the others). Close with a linger still hears the server close
// every stream, the unused ones included: finish starts their readers.
func TestStreamReadersStartWithTheirFirstFrame(t *testing.T) {
	e := newEnv(t)
	before := streamReaders()
	c := e.dial(t, &qrpc.Config{CloseLinger: time.Hour})
	if n := streamReaders() - before; n != 0 {
		t.Fatalf("%d stream readers after the dial, want none", n)
	}
	got := make(chan error, 1)
	if _, err := c.Start(&qrpc.Call{Method: []byte("echo"), Body: []byte("x")}, func(_ *qrpc.Response, err error) { got <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call never finished")
	}
	if n := streamReaders() - before; n != 1 {
		t.Fatalf("%d stream readers after one call, want 1", n)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	// Against an hour of linger: only the server's close of every
	// stream ends Close this side of it.
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close still lingers: a stream's end was never read")
	}
}
