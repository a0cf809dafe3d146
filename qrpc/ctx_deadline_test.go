package qrpc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestCtxDeadlineCountsAsTimeout: a caller whose context's deadline comes
// before call.Deadline gets a timeout, and the observer counts the attempt
// as one (a call result), as when call.Deadline passes; a context
// cancelled by its cancel function is still a cancel, no call result.
func TestCtxDeadlineCountsAsTimeout(t *testing.T) {
	checkGoroutines(t)
	f := newFleet(t)
	addrs := f.start(1)
	f.srvs[0].delay.Store(3000)
	rec := newRecorder()
	p := f.dial(t, addrs, &qrpc.PoolConfig{Observer: rec})
	pr := rec.get(addrs[0])
	if pr == nil {
		t.Fatal("no observer for the server")
	}
	in := func() int64 {
		in, _ := peerState(p, addrs[0])
		return int64(in.Inflight)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := p.Do(ctx, &qrpc.Call{Method: []byte("work"), Deadline: time.Now().Add(10 * time.Second)})
	if !errors.Is(err, qrpc.ErrTimeout) {
		t.Fatalf("ctx deadline: err %v, want a timeout", err)
	}
	testwait.Until(t, "the attempt ends", 5*time.Second, func() bool { return in() == 0 })
	if got := pr.failed.Load(); got != 1 {
		t.Errorf("ctx deadline: %d failed call results, want 1 (the timeout)", got)
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel2)
	_, err = p.Do(ctx2, &qrpc.Call{Method: []byte("work"), Deadline: time.Now().Add(10 * time.Second)})
	if !errors.Is(err, context.Canceled) || errors.Is(err, qrpc.ErrTimeout) {
		t.Fatalf("cancel: err %v, want context.Canceled", err)
	}
	testwait.Until(t, "the attempt ends", 5*time.Second, func() bool { return in() == 0 })
	if got := pr.failed.Load(); got != 1 {
		t.Errorf("cancel: %d failed call results, want still 1 (a cancel is none)", got)
	}
}
