package qrpc

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"
)

// benchPool is a pool of n servers whose clients look connected, enough
// for pick (no network: only the choice is measured).
func benchPool(tb testing.TB, n int, b Balance) *Pool {
	tb.Helper()
	p := &Pool{cfg: PoolConfig{Balance: b, Failures: 3, Eject: time.Second, Observer: NopObserver{}}}
	var peers []*peer
	for i := range n {
		pr := newPeer(p, "10.0.0."+strconv.Itoa(i+1)+":8443")
		sl := &slot{}
		sl.cur.Store(&session{})
		pr.c = &Client{slots: []*slot{sl}}
		peers = append(peers, pr)
	}
	p.set.Store(&peerSet{peers: peers})
	return p
}

func benchPick(b *testing.B, bal Balance) {
	p := benchPool(b, 3, bal)
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = []byte("user-" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			pr, _ := p.pick(keys[i&1023], nil, false)
			if pr == nil {
				b.Fatal("no server")
			}
			i++
		}
	})
}

func BenchmarkPoolPickRoundRobin(b *testing.B)    { benchPick(b, RoundRobin) }
func BenchmarkPoolPickLeastInflight(b *testing.B) { benchPick(b, LeastInflight) }
func BenchmarkPoolPickHash(b *testing.B)          { benchPick(b, Hash) }

// TestPickSkipsEjected: an ejected server gets no call until its time is
// up, then exactly one (the trial) until that call's verdict.
func TestPickSkipsEjected(t *testing.T) {
	for _, bal := range []Balance{RoundRobin, LeastInflight, Hash} {
		p := benchPool(t, 3, bal)
		victim := p.set.Load().peers[1]
		victim.ejectedUntil.Store(time.Now().Add(time.Hour).UnixNano())
		for i := range 300 {
			pr, trial := p.pick([]byte("k"+strconv.Itoa(i)), nil, false)
			if pr == victim || trial {
				t.Fatalf("%v: ejected server picked", bal)
			}
		}
		victim.ejectedUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
		trials := 0
		for i := range 300 {
			if pr, trial := p.pick([]byte("k"+strconv.Itoa(i)), nil, false); pr == victim {
				if !trial {
					t.Fatalf("%v: ejected server picked without a trial", bal)
				}
				trials++
			}
		}
		if trials != 1 {
			t.Fatalf("%v: %d trial calls, want 1", bal, trials)
		}
		p.outcome(victim, true, nil)
		if victim.ejectedUntil.Load() != 0 {
			t.Fatalf("%v: a successful trial did not bring the server back", bal)
		}
	}
}

// TestEjectionDoubles: each failed trial doubles the ejection, up to 10×;
// the last server up is never ejected.
func TestEjectionDoubles(t *testing.T) {
	p := benchPool(t, 2, RoundRobin)
	p.log = slogDiscard()
	a, b := p.set.Load().peers[0], p.set.Load().peers[1]
	fail := errTimeoutForTest()
	for range 3 {
		p.outcome(a, false, fail)
	}
	if a.ejectedUntil.Load() == 0 {
		t.Fatal("not ejected after 3 failures")
	}
	want := time.Second
	for range 6 {
		want = min(2*want, 10*time.Second)
		p.outcome(a, true, fail)
		if got := time.Duration(a.ejectFor.Load()); got != want {
			t.Fatalf("ejection %v, want %v", got, want)
		}
	}
	for range 10 {
		p.outcome(b, false, fail)
	}
	if b.ejectedUntil.Load() != 0 {
		t.Fatal("the last server up was ejected")
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func errTimeoutForTest() error { return fmt.Errorf("%w: test", ErrTimeout) }

// TestRetryAttemptEnds: a retry whose only servers refuse the call at once
// (their connections are down) ends with an error instead of going round
// the same servers for ever.
func TestRetryAttemptEnds(t *testing.T) {
	for _, n := range []int{1, 3} {
		p := benchPool(t, n, RoundRobin)
		for _, pr := range p.set.Load().peers {
			pr.c.slots[0].cur.Store(nil) // connection down: Start refuses
		}
		pc := &poolCall{pool: p, done: func(*Response, error) {}}
		done := make(chan error, 1)
		go func() {
			pc.mu.Lock()
			defer pc.mu.Unlock()
			done <- pc.attempt(&Call{Method: []byte("m")}, true)
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%d servers: %v, want ErrUnavailable", n, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d servers: the retry never ended", n)
		}
	}
}
