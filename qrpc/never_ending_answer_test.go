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

// neverEndingBigServer answers "big" with the start of a frame of 16 MiB
// minus a little (1 MiB of it sent) that it never finishes, the stream
// left open; anything else with an echo at once (on a stream that has not
// had a "big": a stream's answers come in order).
func neverEndingBigServer(t *testing.T, e *env) string {
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
					if _, err := st.Write(make([]byte, 1<<20)); err != nil {
						return
					}
					<-st.Context().Done() // never ends it
					return
				}
			}()
		}
	})
}

// TestConnRecoversAfterNeverEndingAnswer: a server that starts a large
// answer and never ends it. The connection's last stream in service is
// kept for the call after the timed-out one (docs/tuning.md), but not for
// good: kept, it would take every later call and answer none (the QUIC
// connection stays alive: no reconnect). Calls after the big one's
// timeout must be answered again within a few seconds.
func TestConnRecoversAfterNeverEndingAnswer(t *testing.T) {
	for _, streams := range []int{1, 2} {
		t.Run(fmt.Sprintf("streams=%d", streams), func(t *testing.T) {
			checkGoroutines(t)
			e := newEnv(t)
			addr := neverEndingBigServer(t, e)
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
			t.Fatalf("streams=%d: after a never-ending answer timed out, no call was answered in 8 s (%d tries: %v ...)",
				streams, len(errs), errs[:min(3, len(errs))])
		})
	}
}
