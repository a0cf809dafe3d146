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
	p := &Pool{cfg: PoolConfig{Balance: b, Failures: 3, Eject: time.Second, Stall: defaultStall, Observer: NopObserver{}},
		log: slogDiscard()}
	var peers []*peer
	for i := range n {
		pr := newPeer(p, "10.0.0."+strconv.Itoa(i+1)+":8443")
		sl := &slot{}
		sl.cur.Store(&qconn{})
		pr.c = &Client{slots: []*slot{sl}}
		peers = append(peers, pr)
	}
	p.set.Store(&peerSet{peers: peers})
	return p
}

// benchPick measures pick with 3 idle servers, or busy ones (calls in
// flight, answering: the stall check needs the time). A call's attempt
// lends pick the time it reads anyway (its start time), as done here,
// refreshed every 256 picks; an event's pick reads it (one time.Now).
func benchPick(b *testing.B, bal Balance, busy bool) {
	p := benchPool(b, 3, bal)
	if busy {
		for _, pr := range p.set.Load().peers {
			pr.startCall(time.Now())
		}
		// Answering all along: progress keeps up with the clock.
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case now := <-t.C:
					for _, pr := range p.set.Load().peers {
						pr.answered(now)
					}
				}
			}
		}()
	}
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = []byte("user-" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		var now time.Time
		for pb.Next() {
			var clk pickClock
			if busy {
				if i&255 == 0 {
					now = time.Now()
				}
				clk.t = now
			}
			pr, _ := p.pick(keys[i&1023], nil, false, &clk)
			if pr == nil {
				b.Fatal("no server")
			}
			i++
		}
	})
}

func BenchmarkPoolPickRoundRobin(b *testing.B)        { benchPick(b, RoundRobin, false) }
func BenchmarkPoolPickLeastInflight(b *testing.B)     { benchPick(b, LeastInflight, false) }
func BenchmarkPoolPickHash(b *testing.B)              { benchPick(b, Hash, false) }
func BenchmarkPoolPickBusyRoundRobin(b *testing.B)    { benchPick(b, RoundRobin, true) }
func BenchmarkPoolPickBusyLeastInflight(b *testing.B) { benchPick(b, LeastInflight, true) }
func BenchmarkPoolPickBusyHash(b *testing.B)          { benchPick(b, Hash, true) }

// TestPickSkipsEjected: an ejected server gets no call until its time is
// up, then exactly one (the trial) until that call's verdict.
func TestPickSkipsEjected(t *testing.T) {
	for _, bal := range []Balance{RoundRobin, LeastInflight, Hash} {
		p := benchPool(t, 3, bal)
		victim := p.set.Load().peers[1]
		victim.ejectedUntil.Store(time.Now().Add(time.Hour).UnixNano())
		for i := range 300 {
			pr, trial := p.pick([]byte("k"+strconv.Itoa(i)), nil, false, &pickClock{})
			if pr == victim || trial {
				t.Fatalf("%v: ejected server picked", bal)
			}
		}
		victim.ejectedUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
		trials := 0
		for i := range 300 {
			if pr, trial := p.pick([]byte("k"+strconv.Itoa(i)), nil, false, &pickClock{}); pr == victim {
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

// TestPickSkipsStalled: a server with calls in flight and no answer for
// Stall gets no new call while another server can take it; it gets them
// again once it answers; when every server is stalled, or there is only
// one, or Stall is off, calls still go out.
func TestPickSkipsStalled(t *testing.T) {
	picks := func(p *Pool) map[*peer]int {
		got := map[*peer]int{}
		for i := range 300 {
			pr, _ := p.pick([]byte("k"+strconv.Itoa(i)), nil, false, &pickClock{})
			got[pr]++
		}
		return got
	}
	now := time.Now()
	long := now.Add(-time.Second) // 5 × Stall ago
	for _, bal := range []Balance{RoundRobin, LeastInflight, Hash} {
		p := benchPool(t, 3, bal)
		peers := p.set.Load().peers
		for _, pr := range peers {
			pr.startCall(now) // busy, all alike: least_inflight ties
		}
		victim := peers[1]
		victim.progress.Store(monoNS(long))
		if !victim.info().Stalled || peers[0].info().Stalled {
			t.Fatalf("%v: stalled %v, %v", bal, victim.info().Stalled, peers[0].info().Stalled)
		}
		if got := picks(p); got[victim] != 0 || got[nil] != 0 {
			t.Fatalf("%v: the stalled server took %d of 300 calls (%d found none)", bal, got[victim], got[nil])
		}
		victim.answered(time.Now())
		if got := picks(p); got[victim] < 50 {
			t.Fatalf("%v: the server that answered again took %d of 300 calls", bal, got[victim])
		}
		// Every server stalled: the calls still go out, spread as usual.
		for _, pr := range peers {
			pr.progress.Store(monoNS(long))
		}
		if got := picks(p); got[nil] != 0 || got[victim] < 50 {
			t.Fatalf("%v: every server stalled: %d calls found none, %d went to %s", bal, got[nil], got[victim], victim.addr)
		}
		// Off: a server is never stalled.
		p.cfg.Stall = -1
		if got := picks(p); got[victim] < 50 || victim.info().Stalled {
			t.Fatalf("%v: stall off: the silent server took %d of 300 calls", bal, got[victim])
		}
	}
	// One server: always picked, stalled or not.
	p := benchPool(t, 1, RoundRobin)
	only := p.set.Load().peers[0]
	only.startCall(long)
	if !only.info().Stalled {
		t.Fatal("the lone server is not shown stalled")
	}
	if got := picks(p); got[only] != 300 {
		t.Fatalf("the lone stalled server took %d of 300 calls", got[only])
	}
	// An idle server is never stalled, however long it was idle.
	idle := benchPool(t, 2, RoundRobin).set.Load().peers[0]
	idle.progress.Store(monoNS(long))
	if idle.info().Stalled {
		t.Fatal("an idle server is stalled")
	}
}

// TestStallLimit: Stall, shortened to 8 × the pool's typical answer time
// when calls are answered fast, never under 25 ms; off stays off.
func TestStallLimit(t *testing.T) {
	p := benchPool(t, 3, RoundRobin)
	pr := p.set.Load().peers[0]
	for _, tc := range []struct {
		answer, want time.Duration
	}{
		{0, 200 * time.Millisecond}, // nothing answered yet
		{time.Millisecond, 25 * time.Millisecond},
		{10 * time.Millisecond, 80 * time.Millisecond},
		{time.Second, 200 * time.Millisecond},
	} {
		p.answerTime.Store(int64(tc.answer))
		if got := time.Duration(p.stallLimit()); got != tc.want {
			t.Errorf("answer time %v: stall limit %v, want %v", tc.answer, got, tc.want)
		}
	}
	p.cfg.Stall = -1
	if p.stallLimit() > 0 {
		t.Error("stall off, yet a limit")
	}
	// The average follows the answers it samples.
	p.answerTime.Store(0)
	for range 400 {
		pr.calls.Add(1)
		p.noteAnswerTime(pr, 4*time.Millisecond)
	}
	if got := time.Duration(p.answerTime.Load()); got != 4*time.Millisecond {
		t.Errorf("answer time %v after answers of 4 ms", got)
	}
	for range 800 {
		pr.calls.Add(1)
		p.noteAnswerTime(pr, 40*time.Millisecond)
	}
	if got := time.Duration(p.answerTime.Load()); got < 39*time.Millisecond || got > 40*time.Millisecond {
		t.Errorf("answer time %v after answers of 40 ms", got)
	}
}
