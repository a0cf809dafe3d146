package qrpc_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// neverEndingSmallStartServer is neverEndingBigServer with less of the
// frame sent: the header of a 16 MiB answer and 100 KiB of it (under the
// reader's 256 KiB growth step), never finished, the stream left open.
func neverEndingSmallStartServer(t *testing.T, e *env, sent int) string {
	return rawServer(t, e, func(c *quic.Conn) {
		codec := frame.New(0)
		for {
			st, err := c.AcceptStream(c.Context())
			if err != nil {
				return
			}
			go func() {
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
					if string(req.Method) != "big" {
						b, _ := codec.AppendResponse(nil, &qrpcpb.Response{RequestId: req.RequestId, Body: req.Body})
						if _, err := st.Write(b); err != nil {
							return
						}
						continue
					}
					if _, err := st.Write(hdr(16<<20-64, frame.FlagResponse)); err != nil {
						return
					}
					if _, err := st.Write(make([]byte, sent)); err != nil {
						return
					}
					<-st.Context().Done() // never ends it
					return
				}
			}()
		}
	})
}

// TestConnRecoversAfterNeverEndingAnswerShortStart: a never-ending
// frame of which the server sent less than the reader's first growth step
// (256 KiB) never makes the reader Growing, so only the stuck-stream
// check gives the stream up: with 2 streams, once the other answers. With
// one stream nothing does (docs/tuning.md says so: streams = 1 keeps
// such a stream until the connection closes), so that case is not here.
func TestConnRecoversAfterNeverEndingAnswerShortStart(t *testing.T) {
	for _, sent := range []int{0, 100 << 10} {
		for _, streams := range []int{2} {
			t.Run(fmt.Sprintf("sent=%d/streams=%d", sent, streams), func(t *testing.T) {
				checkGoroutines(t)
				e := newEnv(t)
				addr := neverEndingSmallStartServer(t, e, sent)
				c := dialAt(t, e, addr, &qrpc.Config{Streams: streams})
				if _, err := unary(c, 300*time.Millisecond, "big", nil); err == nil {
					t.Fatal("big answered")
				}
				var errs []string
				deadline := time.Now().Add(8 * time.Second)
				for time.Now().Before(deadline) {
					resp, err := unary(c, 500*time.Millisecond, "echo", []byte("next"))
					if err == nil && string(resp.Body) == "next" {
						t.Logf("echo answered after %d failures: %v", len(errs), errs)
						return
					}
					errs = append(errs, fmt.Sprint(err))
					time.Sleep(100 * time.Millisecond)
				}
				t.Fatalf("sent=%d streams=%d: after a never-ending answer timed out, no call was answered in 8 s (%d tries: %v ...)",
					sent, streams, len(errs), errs[:min(3, len(errs))])
			})
		}
	}
}
