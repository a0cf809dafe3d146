package qrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestDoKeepsCallDeadline: Pool.Do does not leave the context's deadline
// in the caller's Call, set or zero. Call documents that Start copies what
// it needs, so a Call is reusable: a later Do of the same Call with a
// context without deadline must not time out at the first context's (long
// past) deadline.
func TestDoKeepsCallDeadline(t *testing.T) {
	checkGoroutines(t)
	f := newFleet(t)
	addrs := f.start(1)
	f.srvs[0].delay.Store(200)
	p := f.dial(t, addrs, nil)

	deadline := time.Now().Add(10 * time.Second)
	call := &qrpc.Call{Method: []byte("work"), Deadline: deadline}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.Do(ctx, call); err == nil {
		t.Fatal("first call: no error, want a timeout at the context's deadline")
	}
	if !call.Deadline.Equal(deadline) {
		t.Errorf("Do changed the caller's call.Deadline from %v to %v", deadline, call.Deadline)
	}
	// the same call again, with a context that has no deadline
	if _, err := p.Do(context.Background(), call); err != nil {
		t.Fatalf("second Do of the same Call (Deadline %v from now): %v", time.Until(deadline).Round(time.Second), err)
	}

	// a Call with no deadline of its own keeps none
	call = &qrpc.Call{Method: []byte("work")}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := p.Do(ctx2, call); err == nil {
		t.Fatal("zero Deadline, first call: no error, want a timeout at the context's deadline")
	}
	if !call.Deadline.IsZero() {
		t.Errorf("Do set the caller's zero call.Deadline to %v", call.Deadline)
	}
	if _, err := p.Do(context.Background(), call); err != nil {
		t.Fatalf("zero Deadline, second Do of the same Call: %v", err)
	}
}
