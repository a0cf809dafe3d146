package qrpc_test

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// TestPartialFrameReleasedAfterTimeout: a server that answers each call
// with the start of a large frame and never finishes it. The calls time
// out; the streams holding those partial frames are retired, so their
// buffers do not stay for the connection's life.
func TestPartialFrameReleasedAfterTimeout(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	const frameLen, streams = 8 << 20, 4
	addr := rawServer(t, e, func(c *quic.Conn) {
		answerEach(c, func(*qrpcpb.Request) []byte {
			return append(hdr(frameLen, frame.FlagResponse), make([]byte, frameLen-2)...)
		})
	})
	c := dialAt(t, e, addr, &qrpc.Config{Streams: streams, StreamBatch: 1})
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for range streams {
		if _, err := unary(c, time.Second, "echo", nil); !errors.Is(err, qrpc.ErrTimeout) {
			t.Fatalf("err %v, want ErrTimeout", err)
		}
	}
	// Each stream held up to frameLen; retired, they hold nothing.
	var held int64
	if !testwait.For(5*time.Second, func() bool {
		held = int64(heap()) - int64(before)
		return held < frameLen/2
	}) {
		t.Fatalf("%d MiB stay allocated after %d calls whose answers stopped short of %d MiB", held>>20, streams, frameLen>>20)
	}
}
