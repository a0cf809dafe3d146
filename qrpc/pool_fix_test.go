package qrpc_test

import (
	"context"
	crand "crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestPoolTooLargeEnds: a request that no server can take (its frame is
// over a stream's send queue, under max_frame_size) ends with "too large"
// on a pool of 12 servers, unary and event alike, in about the time one
// server takes to refuse it: each server is tried at most once, and an
// error every server would give ends the call at once.
func TestPoolTooLargeEnds(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(12)
	conf := qrpc.Config{MaxFrameSize: 64 << 20}
	p := f.dial(t, addrs, &qrpc.PoolConfig{Config: conf})
	body := make([]byte, 17<<20) // random: zstd cannot shrink it under the bound
	_, _ = crand.Read(body)

	// The bound: what one server's client takes to refuse it (encoding
	// and compressing 17 MiB is most of it), measured here, for each of
	// the 12 servers twice.
	one := f.dial(t, addrs[:1], &qrpc.PoolConfig{Config: conf})
	began := time.Now()
	if _, err := one.Do(context.Background(), &qrpc.Call{Method: []byte("who"), Body: body}); !errors.Is(err, qrpc.ErrTooLarge) {
		t.Fatalf("one server: %v, want too large", err)
	}
	bound := 24 * time.Since(began)
	t.Logf("one server refuses it in %v; bound %v", bound/24, bound)

	for _, tc := range []struct {
		name string
		send func() error
	}{
		{"unary", func() error {
			_, err := p.Do(context.Background(), &qrpc.Call{Method: []byte("who"), Body: body, Deadline: time.Now().Add(time.Hour)})
			return err
		}},
		{"event", func() error { return p.SendEvent(&qrpc.Call{Method: []byte("tick"), Body: body}) }},
	} {
		done := make(chan error, 1)
		began := time.Now()
		go func() { done <- tc.send() }()
		select {
		case err := <-done:
			if !errors.Is(err, qrpc.ErrTooLarge) || qrpc.ErrorWord(err) != qrpc.WordTooLarge {
				t.Fatalf("%s: %v, want too large", tc.name, err)
			}
			t.Logf("%s: %v after %v", tc.name, err, time.Since(began))
		case <-time.After(bound):
			// The goroutine is left running: the loop it is in is the bug.
			t.Fatalf("%s: no end after %v", tc.name, bound)
		}
	}
}

// TestPoolEventsKeepTrial: events sent once a server's ejection has run
// out (the first pick of it is a trial) leave it eligible: the next calls
// reach it and bring it back up. An event has no answer, so it cannot be
// the trial; it must give the trial back.
func TestPoolEventsKeepTrial(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	// An ejection of an hour, ended by moving the pool's clock: the trial
	// comes exactly when the test says, however slow the machine.
	p := f.dial(t, addrs, &qrpc.PoolConfig{Failures: 1, Eject: time.Hour, Stall: -1})
	advance := qrpc.ShiftPoolClockForTest(p)
	victim := f.srvs[1]
	victim.freeze()
	testwait.Until(t, "the frozen server ejected", 10*time.Second, func() bool {
		_, _ = poolCall(p, 100*time.Millisecond, "who", "")
		in, _ := peerState(p, victim.addr)
		return in.State == qrpc.PeerEjected
	})
	victim.thaw()
	in, _ := peerState(p, victim.addr)
	if in.State != qrpc.PeerEjected {
		t.Fatalf("the thawed server is %v before its ejection ran out, want ejected", in.State)
	}
	advance(time.Until(in.EjectedUntil) + time.Millisecond)
	for range 4 { // round robin over 2: two of them pick the victim
		if err := p.Event([]byte("tick"), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	before := victim.hits.Load()
	for range 40 {
		if _, err := poolCall(p, 2*time.Second, "who", ""); err != nil {
			t.Fatal(err)
		}
	}
	in, _ = peerState(p, victim.addr)
	if victim.hits.Load() == before || in.State != qrpc.PeerUp {
		t.Fatalf("after the events: %d of 40 calls reached the server, state %v (ejected until %v)",
			victim.hits.Load()-before, in.State, in.EjectedUntil)
	}
}

// TestPoolBadTLSMaterial: a pool whose CA is not PEM fails to connect
// with the configuration error, as a single address does, instead of
// returning a pool without servers.
func TestPoolBadTLSMaterial(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	for _, a := range [][]string{addrs[:1], addrs} {
		cfg := f.config(&qrpc.PoolConfig{})
		cfg.CAPEM = []byte("not a pem")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p, err := qrpc.DialPool(ctx, a, cfg)
		cancel()
		if err == nil {
			_ = p.Close()
			t.Fatalf("%d addresses: connected with a bad CA", len(a))
		}
		if !errors.Is(err, qrpc.ErrBadConfig) || qrpc.ErrorWord(err) != qrpc.WordBadConfig ||
			qrpc.Classify(err).String() != "bad config: ca: no PEM certificate found" {
			t.Fatalf("%d addresses: %v (%q), want the bad config error", len(a), err, qrpc.Classify(err).String())
		}
	}
}
