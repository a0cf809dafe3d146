package qrpc_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// TestTimedOutFramesLeaveSendQueue: a server that does not read its
// stream while calls with 64 KiB bodies time out on it. The frames still
// in the stream's send queue leave it when their calls end: their memory
// comes back at once, and once the server reads, it gets only the frames
// quic-go had taken before (its stream window's worth, and the one being
// written), never the rest.
func TestTimedOutFramesLeaveSendQueue(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	const calls, size = 64, 64 << 10
	// quic-go's default initial stream receive window, the server's here.
	const window = 512 << 10
	release := make(chan struct{})
	var got atomic.Int64
	addr := rawServer(t, e, func(c *quic.Conn) {
		codec := frame.New(0)
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			st, err := c.AcceptStream(c.Context())
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-release:
				case <-c.Context().Done():
					return
				}
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
					if bytes.HasPrefix(req.Body, []byte("call-")) {
						got.Add(1)
						continue
					}
					b, _ := codec.AppendResponse(nil, &qrpcpb.Response{RequestId: req.RequestId, Body: req.Body})
					if _, err := st.Write(b); err != nil {
						return
					}
				}
			}()
		}
	})
	c := dialAt(t, e, addr, &qrpc.Config{Streams: 1})
	heap := func() uint64 {
		runtime.GC()
		runtime.GC() // and the buffer pools' victims
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	var wg sync.WaitGroup
	var timeouts atomic.Int64
	for i := range calls {
		body := make([]byte, size)
		_, _ = rand.Read(body) // no compression
		copy(body, "call-")
		body[5] = byte(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := unary(c, 300*time.Millisecond, "echo", body); errors.Is(err, qrpc.ErrTimeout) {
				timeouts.Add(1)
			}
		}()
	}
	wg.Wait()
	if timeouts.Load() != calls {
		t.Fatalf("%d of %d calls timed out", timeouts.Load(), calls)
	}
	// What quic-go holds stays: on the client, a window's worth and the
	// frame being written; on the server (this process too), the window
	// it received and does not read. The queue behind it does not.
	held := int64(heap()) - int64(before)
	if bound := int64(2*window + 2*size); held > bound {
		t.Errorf("%d KiB stay allocated after %d calls of %d KiB timed out; quic-go holds at most %d KiB", held>>10, calls, size>>10, bound>>10)
	}
	close(release)
	if resp, err := unary(c, 5*time.Second, "echo", []byte("after")); err != nil || string(resp.Body) != "after" {
		t.Fatalf("a call after the server reads again: %v", err)
	}
	if n := got.Load(); n > window/size+2 {
		t.Errorf("the server got %d requests of calls that had timed out; quic-go held at most %d", n, window/size+2)
	}
}
