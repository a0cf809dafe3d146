package qrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// TestOddResponseHeaders: an answer whose flat header list ends with a
// name without a value is delivered without that name.
func TestOddResponseHeaders(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	addr := rawServer(t, e, func(c *quic.Conn) {
		answerEach(c, func(req *qrpcpb.Request) []byte {
			r := &qrpcpb.Response{RequestId: req.RequestId, Body: req.Body,
				Headers: [][]byte{[]byte("a"), []byte("1"), []byte("dangling")}}
			p, _ := r.MarshalVT()
			return append(hdr(uint32(len(p)+1), frame.FlagResponse), p...)
		})
	})
	c := dialAt(t, e, addr, &qrpc.Config{Streams: 1})
	resp, err := unary(c, 5*time.Second, "echo", []byte("hi"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Headers) != 2 || string(resp.Headers[0]) != "a" || string(resp.Headers[1]) != "1" || string(resp.Body) != "hi" {
		t.Fatalf("headers %q body %q, want [a 1] and hi", resp.Headers, resp.Body)
	}
}

// dialAt dials addr with the env's TLS settings; the client is closed at
// the test's end.
func dialAt(t *testing.T, e *env, addr string, cfg *qrpc.Config) *qrpc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, addr, e.config(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
