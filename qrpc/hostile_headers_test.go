package qrpc_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// manyHeaders is the frame of a Response for id with n empty header
// entries (2 bytes each on the wire).
func manyHeaders(id uint64, n int) []byte {
	p := protowire.AppendTag(nil, 3, protowire.VarintType)
	p = protowire.AppendVarint(p, id)
	for range n {
		p = protowire.AppendTag(p, 1, protowire.BytesType)
		p = protowire.AppendBytes(p, nil)
	}
	return append(hdr(uint32(len(p)+1), frame.FlagResponse), p...)
}

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

// TestResponseHeaderEntriesLimit: an answer with MaxResponseHeaderEntries
// entries is delivered; one more pair is a protocol error (as a request
// over its limit is refused).
func TestResponseHeaderEntriesLimit(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	const limit = qrpc.MaxResponseHeaderEntries
	addr := rawServer(t, e, func(c *quic.Conn) {
		answerEach(c, func(req *qrpcpb.Request) []byte {
			if string(req.Method) == "over" {
				return manyHeaders(req.RequestId, limit+2)
			}
			return manyHeaders(req.RequestId, limit)
		})
	})
	c := dialAt(t, e, addr, &qrpc.Config{Streams: 1, BackoffBase: 10 * time.Second})
	resp, err := unary(c, 5*time.Second, "at", nil)
	if err != nil || len(resp.Headers) != limit {
		t.Fatalf("at the limit: %v, %d entries", err, len(resp.Headers))
	}
	_, callErr := unary(c, 5*time.Second, "over", nil)
	if !errors.Is(callErr, qrpc.ErrConnLost) || !errors.Is(callErr, qrpc.ErrProtocol) || !strings.Contains(callErr.Error(), "header entries") {
		t.Fatalf("over the limit: %v, want connection lost: protocol error (header entries)", callErr)
	}
	if r := qrpc.Classify(callErr); r.Word != qrpc.WordConnLost || r.Reason != qrpc.ReasonProtocol {
		t.Fatalf("over the limit: %q", r)
	}
}

// TestResponseHeadersNotPinned: a stream's reader does not keep a large
// header slice of one answer for the next ones.
func TestResponseHeadersNotPinned(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	const limit = qrpc.MaxResponseHeaderEntries
	addr := rawServer(t, e, func(c *quic.Conn) {
		answerEach(c, func(req *qrpcpb.Request) []byte {
			if string(req.Method) == "many" {
				return manyHeaders(req.RequestId, limit)
			}
			return manyHeaders(req.RequestId, 0)
		})
	})
	c := dialAt(t, e, addr, &qrpc.Config{Streams: 1})
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	if _, err := unary(c, 5*time.Second, "few", nil); err != nil {
		t.Fatal(err)
	}
	before := heap()
	if _, err := unary(c, 5*time.Second, "many", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := unary(c, 5*time.Second, "few", nil); err != nil {
		t.Fatal(err)
	}
	// The slice of limit entries is 24*limit bytes; half of it is far
	// above what a call leaves behind otherwise.
	if after := heap(); after > before+12*limit {
		t.Fatalf("heap %d -> %d bytes after one answer of %d header entries: its slice (%d bytes) stays", before, after, limit, 24*limit)
	}
}
