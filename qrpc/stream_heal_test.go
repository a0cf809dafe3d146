package qrpc_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// streamServer is a raw qrpc server that answers "echo" and hands any
// other request to other (which returns false to stop serving that
// stream). It counts the streams it accepted.
func streamServer(t *testing.T, e *env, streams *atomic.Int64, other func(st *quic.Stream, req *qrpcpb.Request) bool) string {
	codec := frame.New(0)
	return rawServer(t, e, func(c *quic.Conn) {
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			st, err := c.AcceptStream(c.Context())
			if err != nil {
				return
			}
			if streams != nil {
				streams.Add(1)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mu sync.Mutex
				r := codec.NewReader(st)
				for {
					_, p, err := r.Next()
					if err != nil {
						return
					}
					var req qrpcpb.Request
					if err := req.UnmarshalVT(p); err != nil {
						return
					}
					if string(req.Method) != "echo" {
						if !other(st, &req) {
							return
						}
						continue
					}
					b, _ := codec.AppendResponse(nil, &qrpcpb.Response{RequestId: req.RequestId, Body: req.Body})
					mu.Lock()
					_, err = st.Write(b)
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
	})
}

// resettingServer resets the stream of any request but "echo", both ways.
func resettingServer(t *testing.T, e *env) string {
	return streamServer(t, e, nil, func(st *quic.Stream, _ *qrpcpb.Request) bool {
		st.CancelRead(7)
		st.CancelWrite(7)
		return false
	})
}

// TestStreamResetHeals: a stream reset by the server fails the calls on
// that stream only; the stream is reopened and the connection stays.
func TestStreamResetHeals(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	var streams atomic.Int64
	addr := streamServer(t, e, &streams, func(st *quic.Stream, _ *qrpcpb.Request) bool {
		st.CancelRead(7)
		st.CancelWrite(7)
		return false
	})
	c := dialAddr(t, e, addr, &qrpc.Config{Streams: 4})
	seen := map[int64]bool{}
	for _, id := range qrpc.StreamIDsForTest(c) {
		seen[id] = true
	}
	for round := range 5 {
		_, err := unary(c, 5*time.Second, "reset", nil)
		if !errors.Is(err, qrpc.ErrConnLost) {
			t.Fatalf("reset call: %v, want ErrConnLost", err)
		}
		// The replacement opens in the background: the connection is back
		// to 4 streams in service, one of them new.
		testwait.Until(t, "a replacement stream in service", 10*time.Second, func() bool {
			ids := qrpc.StreamIDsForTest(c)
			fresh := 0
			for _, id := range ids {
				if !seen[id] {
					fresh++
				}
			}
			return len(ids) == 4 && fresh == 1
		})
		for _, id := range qrpc.StreamIDsForTest(c) {
			seen[id] = true
		}
		// Later calls all succeed, on the same connection.
		for i := range 40 {
			if _, err := unary(c, 5*time.Second, "echo", []byte("x")); err != nil {
				t.Fatalf("round %d, call %d after a reset: %v", round, i, err)
			}
		}
	}
	if n := c.Stats().Reconnects; n != 0 {
		t.Fatalf("%d reconnects: the connection did not survive", n)
	}
	// The server hears of a stream with its first frame: a replacement
	// that no call reached yet is not counted there.
	if n := len(seen); n != 4+5 {
		t.Fatalf("%d streams in service over the test, want the 4 first and 5 replacements", n)
	}
	if n := streams.Load(); n < 5 {
		t.Fatalf("the server saw %d streams: no replacement carried a call", n)
	}
}

// TestStuckStreamRetired: the reference server's unknown-method case: it
// stops reading a stream without closing it. Once a call on that stream
// has timed out while other streams answered later calls, the stream is
// retired and replaced, and later calls all succeed.
func TestStuckStreamRetired(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	var streams atomic.Int64
	addr := streamServer(t, e, &streams, func(*quic.Stream, *qrpcpb.Request) bool {
		return false // stop reading; never close
	})
	c := dialAddr(t, e, addr, &qrpc.Config{Streams: 4})
	// The hole, with calls on the other streams while it waits.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := unary(c, 300*time.Millisecond, "unknown", nil); !errors.Is(err, qrpc.ErrTimeout) {
			t.Errorf("call into the hole: %v, want ErrTimeout", err)
		}
	}()
	testwait.Until(t, "the call into the hole in flight", 5*time.Second, func() bool { return c.Stats().InFlight == 1 })
	var early atomic.Int64
	for range 8 {
		if _, err := unary(c, 500*time.Millisecond, "echo", nil); err != nil {
			early.Add(1) // those that went into the hole
		}
	}
	wg.Wait() // the early calls ended with unary; the hole call too
	for i := range 64 {
		if _, err := unary(c, 2*time.Second, "echo", []byte("x")); err != nil {
			t.Fatalf("call %d after the hole was found: %v", i, err)
		}
	}
	if n := c.Stats().Reconnects; n != 0 {
		t.Fatalf("%d reconnects", n)
	}
	if streams.Load() < 5 {
		t.Fatalf("%d streams: the stuck one was not replaced", streams.Load())
	}
	// The calls after the hole's deadline skip the suspect stream; only
	// the first, sent before, went into it: with StreamBatch (16 by
	// default) it and the hole call share a stream.
	if n := early.Load(); n > 1 {
		t.Fatalf("%d of 8 calls went into the hole, want at most 1: calls went on to a suspect stream", n)
	}
}

func dialAddr(t *testing.T, e *env, addr string, cfg *qrpc.Config) *qrpc.Client {
	t.Helper()
	c, err := qrpc.Dial(t.Context(), addr, e.config(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
