//go:build qrpctesthooks

package qrpc

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// lingerBackend is a server's client whose Close lingers (calls in
// flight) until release is closed.
type lingerBackend struct {
	backend
	release chan struct{}
	closing atomic.Bool
	closed  atomic.Bool
}

func (b *lingerBackend) Close() error {
	b.closing.Store(true)
	<-b.release
	b.closed.Store(true)
	return b.backend.Close()
}

// TestPoolCloseWaitsForPanickedDrain: a drain goroutine that panics
// closes its server in its clean-up, which the pool's wait group covers
// too: Close, which waits for the group and then closes what is still
// listed, does not return while that server is still closing (its
// linger) on the drain goroutine.
func TestPoolCloseWaitsForPanickedDrain(t *testing.T) {
	var reports atomic.Int32
	safego.SetReporter(func(where string, _ any, _ []byte) {
		if where == "pool drain" {
			reports.Add(1)
		}
	})
	t.Cleanup(func() { safego.SetReporter(nil) })
	w, sp := simSmall(t, 2, nil, PoolConfig{Stall: -1}, false, 1)
	_ = w
	p := sp.views[0].p
	addr := w.servers[0].addr

	p.mu.Lock()
	pr := p.peers[addr]
	lb := &lingerBackend{backend: pr.c, release: make(chan struct{})}
	pr.c = lb
	t.Cleanup(func() {
		select {
		case <-lb.release:
		default:
			close(lb.release)
		}
	})
	safego.Arm("pool drain", 1)
	defer safego.Arm("pool drain", 0)
	delete(p.peers, addr)
	p.publish()
	p.startDrain(pr)
	// The drain panics at once; its onPanic (drained) waits for p.mu.
	deadline := time.Now().Add(5 * time.Second)
	for reports.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if reports.Load() == 0 {
		p.mu.Unlock()
		t.Fatal("the drain did not panic")
	}
	time.Sleep(50 * time.Millisecond) // drained blocked on p.mu

	closed := make(chan struct{})
	go func() { _ = p.Close(); close(closed) }()
	time.Sleep(50 * time.Millisecond) // Close past p.wg.Wait, or in it
	p.mu.Unlock()

	select {
	case <-closed:
		if !lb.closed.Load() {
			t.Errorf("Pool.Close returned while the server whose drain panicked was still closing (closing %v): "+
				"the drain's onPanic runs after its p.wg.Done, outside the wait group Close waits on", lb.closing.Load())
		}
	case <-time.After(500 * time.Millisecond):
		// Close waits for the lingering server: what it should do.
	}
	close(lb.release)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the server's linger ended")
	}
}
