package qrpc_test

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

func reportCalls(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

// BenchmarkUnarySequential: one caller, one call at a time, over real QUIC
// on 127.0.0.1 (client and server in this process).
func BenchmarkUnarySequential(b *testing.B) {
	e := newEnv(b)
	c := e.dial(b, nil)
	for _, n := range []int{100, 4 << 10} {
		body := bytes.Repeat([]byte("b"), n)
		b.Run(sizeName(n), func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Unary(ctx, "echo", body); err != nil {
					b.Fatal(err)
				}
			}
			reportCalls(b)
		})
	}
}

// BenchmarkUnaryParallel64: 64 goroutines calling at once over one
// connection (32 streams).
func BenchmarkUnaryParallel64(b *testing.B) {
	e := newEnv(b)
	c := e.dial(b, nil)
	body := bytes.Repeat([]byte("b"), 100)
	b.ReportAllocs()
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for next.Add(1) <= int64(b.N) {
				if _, err := c.Unary(ctx, "echo", body); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	reportCalls(b)
}

// BenchmarkStartSequential is the path the FFI layer takes: Start with a
// Done callback that runs on the stream's reader goroutine, no channel, no
// response copy.
func BenchmarkStartSequential(b *testing.B) {
	e := newEnv(b)
	c := e.dial(b, nil)
	call := &qrpc.Call{Method: []byte("echo"), Body: bytes.Repeat([]byte("b"), 100)}
	done := make(chan struct{}, 1)
	cb := func(_ *qrpc.Response, err error) {
		if err != nil {
			b.Error(err)
		}
		done <- struct{}{}
	}
	b.ReportAllocs()
	for b.Loop() {
		call.Deadline = time.Now().Add(10 * time.Second)
		if _, err := c.Start(call, cb); err != nil {
			b.Fatal(err)
		}
		<-done
	}
	reportCalls(b)
}

// BenchmarkStartPipelined64 keeps 64 calls in flight from one submitter,
// as an nginx worker does: each with a deadline, as the FFI layer sets.
func BenchmarkStartPipelined64(b *testing.B) {
	e := newEnv(b)
	c := e.dial(b, nil)
	call := &qrpc.Call{Method: []byte("echo"), Body: bytes.Repeat([]byte("b"), 100)}
	slots := make(chan struct{}, 64)
	var wg sync.WaitGroup
	cb := func(_ *qrpc.Response, err error) {
		if err != nil {
			b.Error(err)
		}
		<-slots
		wg.Done()
	}
	b.ReportAllocs()
	for b.Loop() {
		slots <- struct{}{}
		wg.Add(1)
		call.Deadline = time.Now().Add(10 * time.Second)
		if _, err := c.Start(call, cb); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	reportCalls(b)
}

func sizeName(n int) string {
	if n >= 1<<10 {
		return string(rune('0'+n>>10)) + "KB"
	}
	return "100B"
}
