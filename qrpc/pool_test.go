package qrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestPoolRoundRobinSpread: 3,000 calls over 3 servers land within ±15 %
// of even, and the observer sees every attempt.
func TestPoolRoundRobinSpread(t *testing.T) {
	checkGoroutines(t)
	f := newFleet(t)
	addrs := f.start(3)
	rec := newRecorder()
	p := f.dial(t, addrs, &qrpc.PoolConfig{Observer: rec})
	const total, workers = 3000, 20
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= total {
				if _, err := poolCall(p, 5*time.Second, "who", ""); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d calls failed", failed.Load())
	}
	for _, m := range f.srvs {
		h := m.hits.Load()
		if math.Abs(float64(h)-total/3) > 0.15*total/3 {
			t.Errorf("server %s: %d of %d calls, want %d ±15%%", m.addr, h, total, total/3)
		}
		r := rec.get(m.addr)
		if r == nil || r.ok.Load() != h || r.inflight.Load() != 0 || r.sent.Load() == 0 || r.recv.Load() == 0 {
			t.Errorf("observer of %s: %+v, server saw %d", m.addr, r, h)
		}
		if st := r.stateList(); len(st) == 0 || st[len(st)-1] != qrpc.PeerUp {
			t.Errorf("observer states of %s: %v", m.addr, st)
		}
		in, _ := peerState(p, m.addr)
		if in.State != qrpc.PeerUp || in.Calls != uint64(h) || in.Inflight != 0 {
			t.Errorf("peer %+v, server saw %d", in, h)
		}
	}
	if s := p.Stats(); s.InFlight != 0 {
		t.Errorf("stats %+v", s)
	}
	if n := p.Conns(); n != 3 {
		t.Errorf("%d connections, want 3", n)
	}
}

// TestPoolEvents: events are spread too, and all arrive.
func TestPoolEvents(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	p := f.dial(t, f.start(3), &qrpc.PoolConfig{Observer: rec})
	for i := 0; i < 300; i++ {
		if err := p.Event([]byte("tick"), nil, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Until(t, "300 events arrive", 10*time.Second, func() bool {
		return f.srvs[0].evts.Load()+f.srvs[1].evts.Load()+f.srvs[2].evts.Load() == 300
	})
	for _, m := range f.srvs {
		if n := m.evts.Load(); n < 50 || rec.get(m.addr).events.Load() != n {
			t.Errorf("server %s got %d of 300 events, observer saw %d", m.addr, n, rec.get(m.addr).events.Load())
		}
	}
}

// TestPoolLeastInflight: with one server made slow, least_inflight sends
// most calls to the fast one (round-robin would split them evenly).
func TestPoolLeastInflight(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	f.srvs[1].delay.Store(100)
	for _, tc := range []struct {
		balance qrpc.Balance
		check   func(fast, slow int64) bool
	}{
		{qrpc.LeastInflight, func(fast, slow int64) bool { return fast > 3*slow }},
		{qrpc.RoundRobin, func(fast, slow int64) bool { return fast < 2*slow }},
	} {
		t.Run(tc.balance.String(), func(t *testing.T) {
			for _, m := range f.srvs {
				m.hits.Store(0)
			}
			p := f.dial(t, addrs, &qrpc.PoolConfig{Balance: tc.balance})
			var wg sync.WaitGroup
			for range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 20 {
						if _, err := poolCall(p, 10*time.Second, "work", ""); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			fast, slow := f.srvs[0].hits.Load(), f.srvs[1].hits.Load()
			t.Logf("%v: fast %d, slow %d", tc.balance, fast, slow)
			if !tc.check(fast, slow) {
				t.Fatalf("%v: fast server %d calls, slow %d", tc.balance, fast, slow)
			}
		})
	}
}

// TestPoolHash: a key keeps its server; with a fourth server, about a
// quarter of the keys move (at most 40 %), all of them to the new server.
func TestPoolHash(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(4)
	p3 := f.dial(t, addrs[:3], &qrpc.PoolConfig{Balance: qrpc.Hash})
	p4 := f.dial(t, []string{addrs[3], addrs[1], addrs[0], addrs[2]}, &qrpc.PoolConfig{Balance: qrpc.Hash})
	const keys = 600
	where := func(p *qrpc.Pool, k int) string {
		resp, err := poolCall(p, 5*time.Second, "who", fmt.Sprintf("user-%d", k))
		if err != nil {
			t.Fatal(err)
		}
		return string(resp.Body)
	}
	moved := 0
	count := map[string]int{}
	for k := range keys {
		a, b := where(p3, k), where(p3, k)
		if a != b {
			t.Fatalf("key %d went to %s then %s", k, a, b)
		}
		count[a]++
		c := where(p4, k)
		if c != a {
			moved++
			if c != "s3" {
				t.Fatalf("key %d moved from %s to %s, not to the new server", k, a, c)
			}
		}
	}
	t.Logf("3 servers: %v; %d of %d keys moved to the 4th", count, moved, keys)
	if moved > keys*40/100 || moved < keys/10 {
		t.Fatalf("%d of %d keys moved", moved, keys)
	}
	for s, n := range count {
		if n < keys/6 {
			t.Errorf("server %s holds %d of %d keys", s, n, keys)
		}
	}
}

// TestPoolServerKilled: under concurrent load, one server is killed (its
// port closed, as after kill -9: the kernel answers ICMP port unreachable).
// Only the calls in flight on it at the kill fail, and those sent to it in
// the moment before the client hears (counted: a few at most); they fail
// at once, not at their deadline; nothing fails after that; restarted, it
// is back within the ejection plus a dial.
func TestPoolServerKilled(t *testing.T) {
	checkGoroutines(t)
	f := newFleet(t)
	addrs := f.start(3)
	for _, m := range f.srvs {
		m.delay.Store(20) // calls in flight at the kill
	}
	rec := newRecorder()
	const deadline = 3 * time.Second
	logs := &logCapture{}
	p := f.dial(t, addrs, &qrpc.PoolConfig{
		Config:   qrpc.Config{Logger: slog.New(logs)},
		Eject:    time.Second,
		Observer: rec,
	})
	victim := f.srvs[1]
	var slowest atomic.Int64 // ns
	ld := startTally(t, 30, func() error {
		start := time.Now()
		_, err := poolCall(p, deadline, "work", "")
		for d := int64(time.Since(start)); err != nil; {
			if cur := slowest.Load(); d <= cur || slowest.CompareAndSwap(cur, d) {
				break
			}
		}
		return err
	})
	testwait.Until(t, "at least 3 calls in flight on the victim", 10*time.Second, func() bool {
		in, _ := peerState(p, victim.addr)
		return in.Inflight >= 3
	})
	atKill, _ := peerState(p, victim.addr)
	killedAt := time.Now()
	victim.kill()
	testwait.Until(t, "the killed server is out (ejected or connecting)", 5*time.Second, func() bool {
		in, _ := peerState(p, victim.addr)
		return in.State != qrpc.PeerUp
	})
	out := time.Since(killedAt)
	// The calls caught on it end, and their callers have their errors.
	testwait.Until(t, "the calls caught on the killed server end", 2*deadline, func() bool {
		in, _ := peerState(p, victim.addr)
		return in.Inflight == 0 && int64(len(ld.failures())) == rec.get(victim.addr).failed.Load()
	})
	in, _ := peerState(p, victim.addr)
	sentAfter := int64(in.Calls - atKill.Calls)
	errs := ld.failures()
	n, slow := len(errs), time.Duration(slowest.Load())
	t.Logf("%d calls in flight on the victim at the kill, %d sent to it after; %d failed (slowest failure %v), state %v with %d failures, out %v after the kill",
		atKill.Inflight, sentAfter, n, slow, in.State, in.Failures, out)
	// The snapshot is taken just before the kill: some of its calls may
	// still be answered, and calls sent between it and the kill too.
	if n == 0 || int64(n) > int64(atKill.Inflight)+sentAfter {
		t.Errorf("%d calls failed, want 1 to the %d in flight at the kill + the %d sent after", n, atKill.Inflight, sentAfter)
	}
	// Before ICMP, the calls caught on a killed server waited out their
	// deadline (3 s), and new ones went to it until three had: it was out
	// only then, with hundreds of calls failed.
	if out > deadline/2 {
		t.Errorf("out %v after the kill: want about at once, long before the %v deadline", out, deadline)
	}
	if slow > deadline/2 {
		t.Errorf("a failed call took %v: the kill should end them at once, not at the %v deadline", slow, deadline)
	}
	for _, err := range errs {
		if r := qrpc.Classify(err); r.Word != qrpc.WordConnLost || r.Reason != qrpc.ReasonRefused {
			t.Errorf("failure %q, want connection lost: refused", qrpc.ErrorString(err))
		}
	}
	if r := rec.get(victim.addr); r.failed.Load() != int64(n) {
		t.Errorf("%d calls failed, %d failed attempts on the victim", n, r.failed.Load())
	}
	// Over the next 300 calls, none fails.
	progress(t, "calls after the kill", ld.oks.Load, 300, 30*time.Second, nil)
	if after := len(ld.failures()) - n; after != 0 {
		t.Fatalf("%d calls failed after the killed server was out", after)
	}

	victim.hits.Store(0)
	victim.restart()
	restartedAt := time.Now()
	testwait.Until(t, "the restarted server is back and takes calls", 30*time.Second, func() bool {
		in, _ := peerState(p, victim.addr)
		return in.State == qrpc.PeerUp && victim.hits.Load() > 10
	})
	t.Logf("back %v after the restart", time.Since(restartedAt))
	ld.stop()
	for _, a := range addrs {
		if n := rec.get(a).failed.Load(); a != victim.addr && n != 0 {
			t.Fatalf("%d failed attempts on %s, which stayed up", n, a)
		}
	}
}

// TestPoolServerFrozen: under concurrent load, one server goes silent
// with its port open (SIGSTOP, a partition): nothing tells the client, so
// only timeouts do. Only calls sent to it before its ejection fail, it is
// ejected after `failures` failures, nothing fails after that; thawed, it
// is back after its ejection.
func TestPoolServerFrozen(t *testing.T) {
	checkGoroutines(t)
	f := newFleet(t)
	addrs := f.start(3)
	rec := newRecorder()
	const deadline = 1500 * time.Millisecond
	logs := &logCapture{}
	p := f.dial(t, addrs, &qrpc.PoolConfig{
		Config:   qrpc.Config{IdleTimeout: 2 * time.Second, Logger: slog.New(logs)},
		Eject:    time.Second,
		Observer: rec,
	})
	victim := f.srvs[1]
	ld := startTally(t, 30, func() error {
		_, err := poolCall(p, deadline, "who", "")
		return err
	})
	progress(t, "calls before the freeze", ld.oks.Load, 100, 30*time.Second, nil)
	killedAt := time.Now()
	victim.freeze()
	var atEjection qrpc.PeerInfo
	testwait.Until(t, "the silent server is ejected", 10*time.Second, func() bool {
		atEjection, _ = peerState(p, victim.addr)
		return atEjection.State == qrpc.PeerEjected
	})
	ejectedAt := time.Now()
	// The run of failures that ejected it stays visible (nginx's
	// conn:peers() shows it) until the server is back.
	if atEjection.Failures < 3 {
		t.Errorf("ejected with %d failures shown, want at least health.failures (3)", atEjection.Failures)
	}
	// Calls sent before the ejection may still be waiting out their
	// deadline; after that, nothing fails: over 100 calls, or until the
	// ejection nears its end (no trial call yet), whichever comes first.
	testwait.Until(t, "the calls caught on the frozen server end", 2*deadline, func() bool {
		in, _ := peerState(p, victim.addr)
		return in.Inflight == 0 && int64(len(ld.failures())) == rec.get(victim.addr).failed.Load()
	})
	before := len(ld.failures())
	okBefore := ld.oks.Load()
	progress(t, "calls after the ejection", ld.oks.Load, 100, 30*time.Second, func() bool {
		in, _ := peerState(p, victim.addr)
		return time.Until(in.EjectedUntil) < 100*time.Millisecond
	})
	if after := len(ld.failures()) - before; after != 0 {
		t.Fatalf("%d calls failed after the ejection", after)
	}
	if ld.oks.Load() == okBefore {
		t.Fatal("no calls succeeded after the ejection")
	}
	r := rec.get(victim.addr)
	if r.failed.Load() < 3 || r.ejected.Load() < 1 {
		t.Fatalf("victim: %d failed attempts, %d ejections", r.failed.Load(), r.ejected.Load())
	}
	// Every failure was an attempt on the victim.
	var others int64
	for _, a := range addrs {
		if a != victim.addr {
			others += rec.get(a).failed.Load()
		}
	}
	if others != 0 {
		t.Fatalf("%d failed attempts on the servers that stayed up", others)
	}
	if int64(before) != r.failed.Load() {
		t.Fatalf("%d calls failed, %d attempts on the victim", before, r.failed.Load())
	}
	t.Logf("frozen; %d calls failed, all on it, ejected after %v", before, ejectedAt.Sub(killedAt))

	victim.hits.Store(0)
	victim.thaw()
	restartedAt := time.Now()
	testwait.Until(t, "the thawed server is back and takes calls", 30*time.Second, func() bool {
		in, _ := peerState(p, victim.addr)
		return in.State == qrpc.PeerUp && victim.hits.Load() > 10
	})
	t.Logf("back %v after the thaw", time.Since(restartedAt))
	for _, msg := range []string{"qrpc server ejected", "qrpc server back"} {
		if n := logs.count(msg, victim.addr); n < 1 {
			t.Errorf("no %q line for the victim in the log", msg)
		}
	}
	if n := logs.count("qrpc server ejected", ""); n > 5 {
		t.Errorf("%d ejection lines: one per state change, not per call", n)
	}
	ld.stop()
	// Trial calls while it was down may fail: at most one per ejection.
	if extra := int64(len(ld.failures()) - before); extra > r.ejected.Load() {
		t.Fatalf("%d calls failed after the first ejection, %d ejections", extra, r.ejected.Load())
	}
	for _, a := range addrs {
		if n := rec.get(a).failed.Load(); a != victim.addr && n != 0 {
			t.Fatalf("%d failed attempts on %s, which stayed up", n, a)
		}
	}
}

// TestPoolAllDown: every server silent → calls fail fast with "no server
// up"; servers back → calls succeed again.
func TestPoolAllDown(t *testing.T) {
	checkGoroutines(t)
	f := newFleet(t)
	addrs := f.start(3)
	p := f.dial(t, addrs, &qrpc.PoolConfig{
		Config: qrpc.Config{IdleTimeout: time.Second},
		Eject:  500 * time.Millisecond,
	})
	if _, err := poolCall(p, 5*time.Second, "who", ""); err != nil {
		t.Fatal(err)
	}
	for _, m := range f.srvs {
		m.kill()
	}
	var last error
	testwait.Until(t, "calls fail fast with no server up", 20*time.Second, func() bool {
		began := time.Now()
		_, err := poolCall(p, 5*time.Second, "who", "")
		last = err
		return errors.Is(err, qrpc.ErrNoServer) && time.Since(began) < 100*time.Millisecond
	})
	if !errors.Is(last, qrpc.ErrUnavailable) || !strings.Contains(last.Error(), "unavailable: no server up (") {
		t.Fatalf("error %q", last)
	}
	var ne *qrpc.NoServerError
	if !errors.As(last, &ne) || ne.Ejected+ne.Connecting != 3 {
		t.Fatalf("error %#v", last)
	}
	t.Logf("all down: %v", last)
	for _, m := range f.srvs {
		m.restart()
	}
	testwait.Until(t, "calls succeed after the restart", 30*time.Second, func() bool {
		_, err := poolCall(p, time.Second, "who", "")
		return err == nil
	})
}

// TestPoolFailoverNeverSent: a server that cannot be reached gets no
// calls; none fails, with or without retries.
func TestPoolFailoverNeverSent(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(3)
	f.srvs[2].kill() // nothing listens there: it stays "connecting"
	p := f.dial(t, addrs, &qrpc.PoolConfig{Config: qrpc.Config{DialTimeout: 300 * time.Millisecond}})
	for i := 0; i < 300; i++ {
		if _, err := poolCall(p, 5*time.Second, "who", ""); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	in, _ := peerState(p, addrs[2])
	if in.State != qrpc.PeerConnecting || in.Calls != 0 {
		t.Fatalf("dead server: %+v", in)
	}
	if h0, h1 := f.srvs[0].hits.Load(), f.srvs[1].hits.Load(); h0+h1 != 300 || h0 < 100 || h1 < 100 {
		t.Fatalf("hits %d, %d", h0, h1)
	}

	// A server that shuts down under load (answering what it has, then
	// closing the connection): calls that find its connection closed were
	// never sent and go to the other server; the few in flight when the
	// connection closed may have run, and take their one retry. None fails.
	var failed, done atomic.Int64
	var last atomic.Pointer[error]
	stop := make(chan struct{})
	wg := load(20, stop, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := p.Do(ctx, &qrpc.Call{Method: []byte("who"), Retries: 1})
		return err
	}, func(err error, _ time.Time) {
		done.Add(1)
		if err != nil {
			failed.Add(1)
			last.Store(&err)
		}
	})
	progress(t, "calls before the shutdown", done.Load, 100, 30*time.Second, nil)
	m := f.srvs[0]
	m.mu.Lock()
	srv := m.srv
	m.mu.Unlock()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "the closed server is seen down", 10*time.Second, func() bool {
		in, _ := peerState(p, addrs[0])
		return in.State != qrpc.PeerUp
	})
	// The next 200 calls: none fails, the remaining server takes them.
	h1 := f.srvs[1].hits.Load()
	progress(t, "calls after the shutdown", done.Load, 200, 30*time.Second, nil)
	close(stop)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d calls failed when a server shut down; last: %v", n, *last.Load())
	}
	if f.srvs[1].hits.Load() <= h1 {
		t.Fatal("the remaining server took no calls")
	}
}

// TestPoolOneAddress: one address is a Client: the dial error comes from
// DialPool, and with the server gone calls fail with the client's error.
func TestPoolOneAddress(t *testing.T) {
	f := newFleet(t)
	m := f.add("127.0.0.1:0")
	p := f.dial(t, []string{m.addr}, &qrpc.PoolConfig{Config: qrpc.Config{IdleTimeout: 500 * time.Millisecond}})
	for range 10 {
		if _, err := poolCall(p, 5*time.Second, "who", ""); err != nil {
			t.Fatal(err)
		}
	}
	m.kill()
	testwait.Until(t, "calls fail fast with the client's error", 20*time.Second, func() bool {
		_, err := poolCall(p, 5*time.Second, "who", "")
		return errors.Is(err, qrpc.ErrUnavailable) && !errors.Is(err, qrpc.ErrNoServer)
	})
	// Never ejected: it is the last server.
	if in, _ := peerState(p, m.addr); in.State != qrpc.PeerConnecting {
		t.Fatalf("peer %+v", in)
	}
	m.restart()
	testwait.Until(t, "recovers", 20*time.Second, func() bool {
		_, err := poolCall(p, time.Second, "who", "")
		return err == nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.kill()
	_, err := qrpc.DialPool(ctx, []string{m.addr}, f.config(&qrpc.PoolConfig{Config: qrpc.Config{DialTimeout: 300 * time.Millisecond}}))
	var de *qrpc.DialError
	if !errors.As(err, &de) {
		t.Fatalf("dial of a dead server: %v, want a DialError", err)
	}
}

// TestPoolBadConfig: bad input is an ErrBadConfig, not a pool.
func TestPoolBadConfig(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		cfg   qrpc.PoolConfig
		want  string
	}{
		{nil, qrpc.PoolConfig{}, "no address"},
		{[]string{"127.0.0.1:1", "127.0.0.1:1"}, qrpc.PoolConfig{}, "duplicate address"},
		{[]string{"127.0.0.1"}, qrpc.PoolConfig{}, "want host:port"},
		{[]string{"127.0.0.1:1"}, qrpc.PoolConfig{Failures: -1}, "failures"},
		{[]string{"127.0.0.1:1"}, qrpc.PoolConfig{Eject: -1}, "ejection"},
		{[]string{"127.0.0.1:1"}, qrpc.PoolConfig{Balance: 9}, "balance"},
		{[]string{"127.0.0.1:1"}, qrpc.PoolConfig{Resolver: "nope"}, "resolver"},
	} {
		_, err := qrpc.DialPool(context.Background(), tc.addrs, &tc.cfg)
		if !errors.Is(err, qrpc.ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %+v: %v, want %q", tc.addrs, tc.cfg, err, tc.want)
		}
	}
	if _, err := qrpc.ParseBalance("random"); !errors.Is(err, qrpc.ErrBadConfig) {
		t.Errorf("ParseBalance: %v", err)
	}
}

// TestPoolActiveCheck: with a health check, a silent server is ejected
// without any call of the user's, and comes back as soon as it answers.
func TestPoolActiveCheck(t *testing.T) {
	checkGoroutines(t)
	f := newFleet(t)
	addrs := f.start(2)
	p := f.dial(t, addrs, &qrpc.PoolConfig{
		Config: qrpc.Config{IdleTimeout: 2 * time.Second},
		Eject:  time.Minute, // only the check can bring it back in time
		Check:  qrpc.HealthCheck{Method: "hc", Interval: 100 * time.Millisecond, Timeout: 200 * time.Millisecond},
	})
	victim := f.srvs[0]
	victim.freeze()
	testwait.Until(t, "ejected by the check", 10*time.Second, func() bool {
		in, _ := peerState(p, victim.addr)
		return in.State == qrpc.PeerEjected
	})
	if victim.hits.Load() != 0 || f.srvs[1].hits.Load() != 0 {
		t.Fatal("user calls were made")
	}
	victim.thaw()
	testwait.Until(t, "back through the check", 20*time.Second, func() bool {
		in, _ := peerState(p, victim.addr)
		return in.State == qrpc.PeerUp
	})
}

// TestPoolRetries: a call that failed after it may have run (here: its
// stream reset by the server) is retried on another server only when the
// caller asked for retries.
func TestPoolRetries(t *testing.T) {
	e := newEnv(t)
	f := &fleet{t: t, ca: e.ca, cert: e.cert, key: e.resetKey}
	good := f.add("127.0.0.1:0")
	bad := resettingServer(t, e)
	p := f.dial(t, []string{bad, good.addr}, &qrpc.PoolConfig{Failures: 1 << 20})
	failed := 0
	for range 40 {
		if _, err := poolCall(p, 5*time.Second, "who", ""); err != nil {
			if !errors.Is(err, qrpc.ErrConnLost) {
				t.Fatalf("err %v, want ErrConnLost", err)
			}
			failed++
		}
	}
	if failed < 10 {
		t.Fatalf("without retries %d of 40 calls failed, want about half", failed)
	}
	for range 40 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := p.Do(ctx, &qrpc.Call{Method: []byte("who"), Retries: 1})
		cancel()
		if err != nil {
			t.Fatalf("with a retry: %v", err)
		}
	}
	// The pool's default applies when the call says nothing.
	p2 := f.dial(t, []string{bad, good.addr}, &qrpc.PoolConfig{Failures: 1 << 20, Retries: 2})
	for range 40 {
		if _, err := poolCall(p2, 5*time.Second, "who", ""); err != nil {
			t.Fatalf("pool retries: %v", err)
		}
	}
}

// TestPoolStartAttempts: StartAttempts reports the attempts of each call:
// 1 for a call the good server answered first, 2 for one retried after
// the resetting server failed it; a call that fails on every server
// reports them all, as its error says.
func TestPoolStartAttempts(t *testing.T) {
	e := newEnv(t)
	f := &fleet{t: t, ca: e.ca, cert: e.cert, key: e.resetKey}
	good := f.add("127.0.0.1:0")
	bad := resettingServer(t, e)
	type outcome struct {
		attempts int
		err      error
	}
	start := func(p *qrpc.Pool, retries int) outcome {
		ch := make(chan outcome, 1)
		call := &qrpc.Call{Method: []byte("who"), Retries: retries, Deadline: time.Now().Add(5 * time.Second)}
		if _, err := p.StartAttempts(call, func(_ *qrpc.Response, n int, err error) {
			ch <- outcome{n, err}
		}); err != nil {
			t.Fatal(err)
		}
		return <-ch
	}
	p := f.dial(t, []string{bad, good.addr}, &qrpc.PoolConfig{Failures: 1 << 20})
	seen := map[int]int{}
	for range 40 {
		o := start(p, 1)
		if o.err != nil {
			t.Fatalf("with a retry: %v", o.err)
		}
		seen[o.attempts]++
	}
	if seen[1] == 0 || seen[2] == 0 || seen[1]+seen[2] != 40 {
		t.Fatalf("attempts per call %v, want 1 and 2 only, both seen", seen)
	}
	both := f.dial(t, []string{bad, resettingServer(t, e)}, &qrpc.PoolConfig{Failures: 1 << 20})
	if o := start(both, 1); o.attempts != 2 || o.err == nil || !strings.HasSuffix(o.err.Error(), " (2 attempts)") {
		t.Fatalf("on two resetting servers: %d attempts, err %v; want 2 and its count in the error", o.attempts, o.err)
	}
}

// TestPoolEjectionKeepsFailures: calls made one at a time to a silent
// server: the ejection comes after exactly health.failures of them, and
// Peers() still shows that run of failures while the server is out.
func TestPoolEjectionKeepsFailures(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	p := f.dial(t, addrs, &qrpc.PoolConfig{Balance: qrpc.Hash, Eject: 10 * time.Second})
	key := ""
	for k := 0; k < 100 && key == ""; k++ {
		resp, err := poolCall(p, 5*time.Second, "who", fmt.Sprintf("k%d", k))
		if err != nil {
			t.Fatal(err)
		}
		if string(resp.Body) == "s1" {
			key = fmt.Sprintf("k%d", k)
		}
	}
	if key == "" {
		t.Fatal("no key of 100 maps to s1")
	}
	f.srvs[1].freeze()
	var errs []string
	for i := 1; i <= 3; i++ {
		start := time.Now()
		// The call's own deadline, not a context's: a context that ends
		// races the attempt's timeout, and a loaded machine can let the
		// context win, a cancel that is no verdict on the server.
		_, err := p.Do(context.Background(), &qrpc.Call{Method: []byte("who"), HashKey: []byte(key),
			Deadline: start.Add(300 * time.Millisecond)})
		if err == nil {
			t.Fatalf("call %d to the frozen server succeeded", i)
		}
		errs = append(errs, fmt.Sprintf("%v after %s", err, time.Since(start).Round(time.Millisecond)))
	}
	// A caller that gives up at its deadline may return while the
	// attempt's own timeout, which raced it, is still being counted:
	// wait (bounded) for the attempt to leave the server.
	var in qrpc.PeerInfo
	testwait.For(5*time.Second, func() bool {
		in, _ = peerState(p, addrs[1])
		return in.Inflight == 0
	})
	if in.State != qrpc.PeerEjected || in.Failures != 3 {
		t.Fatalf("after 3 failed calls: state %v, %d failures shown; want ejected with 3 (the calls: %q)", in.State, in.Failures, errs)
	}
	resp, err := poolCall(p, 5*time.Second, "who", key)
	if err != nil || string(resp.Body) != "s0" {
		t.Fatalf("the key's next call: %v %v, want s0", resp, err)
	}
}

// TestPoolStallFrozen: paced clients (60, out of step), one of 3 servers
// goes silent, its port open (a killed one is heard of at once, see
// TestPoolServerKilled). With the stall signal new calls leave it at most a stall
// limit after its last answer, long before the calls caught on it time
// out (1 s): the calls that fail are those in flight on it at the freeze
// plus those sent to it in that window. A client whose calls are further
// apart than the limit starts at most one in the window, and round robin
// sends one call in three to the victim: at most 60 / 3 (+2 for the
// turn's rounding) after the freeze on a quiet machine. Without the signal a client is caught
// within its next few calls: nearly all 60 fail.
//
//   - slow calls: 30 ms calls every 130-170 ms, Stall 100 ms;
//   - fast calls: ~1 ms calls every 60-90 ms (clients that do something
//     else between calls, as nginx's do), Stall at its default (200 ms)
//     but the limit 8 × the answer time, at least 25 ms: with a flat
//     200 ms, clients would come back 2 or 3 times within it.
func TestPoolStallFrozen(t *testing.T) {
	checkGoroutines(t)
	for _, tc := range []struct {
		name         string
		stall        time.Duration
		method       string
		pause, jit   time.Duration
		wantContrast bool
	}{
		{"slow calls", 100 * time.Millisecond, "work", 100 * time.Millisecond, 40 * time.Millisecond, false},
		{"fast calls", 0, "who", 60 * time.Millisecond, 30 * time.Millisecond, false},
		{"stall off", -1, "work", 100 * time.Millisecond, 40 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			addrs := f.start(3)
			for _, m := range f.srvs {
				m.delay.Store(30)
			}
			rec := newRecorder()
			logs := &logCapture{}
			p := f.dial(t, addrs, &qrpc.PoolConfig{
				Config:   qrpc.Config{IdleTimeout: 3 * time.Second, Logger: slog.New(logs)},
				Eject:    5 * time.Second,
				Stall:    tc.stall,
				Observer: rec,
			})
			const workers, deadline = 60, time.Second
			var failed, oks atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Out of step: a client that goes in waves with the
					// others makes every call of a wave land in one window.
					pause := time.Duration(w) * (tc.pause + tc.jit) / workers
					for {
						select {
						case <-stop:
							return
						case <-time.After(pause):
						}
						if _, err := poolCall(p, deadline, tc.method, ""); err != nil {
							failed.Add(1)
						} else {
							oks.Add(1)
						}
						pause = tc.pause + rand.N(tc.jit)
					}
				}()
			}
			defer func() {
				select {
				case <-stop:
				default:
					close(stop)
				}
				wg.Wait()
			}()
			// Every client has made its first calls (and the answer times
			// are measured) before the freeze.
			progress(t, "calls before the freeze", oks.Load, 3*workers, 30*time.Second, nil)
			victim := f.srvs[1]
			atKill, _ := peerState(p, victim.addr)
			frozeAt := time.Now()
			victim.freeze()
			// How long until new calls leave it for good: the stall limit
			// after its last answer (or, stall off, the ejection after its
			// calls' 1 s timeouts). A stall may flicker on at the freeze
			// (answers already on their way end it): the last time it came
			// on counts.
			window := time.Duration(-1)
			// The verdict, once seen, holds until the victim answers or has
			// no call left in flight: from the last time it came on, no new
			// call goes to the victim (its Calls stay where they were).
			seen, idle := false, false
			var callsAtVerdict, sentAfterVerdict uint64
			// Samples the victim's state (no event to wait on), bounded:
			// the test measures when the verdict comes.
			for prev := false; time.Since(frozeAt) < 10*time.Second; time.Sleep(2 * time.Millisecond) { // the scenario's sampling period (2 ms) of the victim's state
				in, _ := peerState(p, victim.addr)
				if in.State == qrpc.PeerEjected {
					if !prev {
						window = time.Since(frozeAt)
					}
					break
				}
				if in.Stalled && !prev {
					window = time.Since(frozeAt)
					seen, callsAtVerdict = true, in.Calls
				}
				if in.Stalled {
					sentAfterVerdict = in.Calls - callsAtVerdict
				}
				idle = idle || seen && in.Inflight == 0
				prev = in.Stalled
			}
			if in, _ := peerState(p, victim.addr); in.State != qrpc.PeerEjected {
				t.Fatalf("10 s after the freeze: %v, want ejected", in.State)
			}
			testwait.Until(t, "the calls caught on the victim end", 3*deadline, func() bool {
				in, _ := peerState(p, victim.addr)
				return in.Inflight == 0 && failed.Load() == rec.get(victim.addr).failed.Load()
			})
			in, _ := peerState(p, victim.addr)
			n := failed.Load()
			sentAfter := int64(in.Calls - atKill.Calls)
			t.Logf("%d calls in flight on the victim at the freeze, %d sent to it after; %d calls failed, %d succeeded; out of new calls' way after %v",
				atKill.Inflight, sentAfter, n, oks.Load(), window)
			if r := rec.get(victim.addr); r.failed.Load() != n {
				t.Fatalf("%d calls failed, %d attempts on the victim", n, r.failed.Load())
			}
			if tc.wantContrast {
				// The contrast: without the signal most clients are caught.
				if n < int64(atKill.Inflight)+workers/3 {
					t.Errorf("stall off: only %d calls failed", n)
				}
				return
			}
			// Found by the stall signal before the timeouts eject it: its
			// silence is counted in the time the other servers went on
			// answering, so a loaded machine delays the verdict only by
			// the time it stood still, and no constant bounds it here.
			if !seen {
				t.Fatalf("never seen stalled before the ejection (%v after the freeze)", window)
			}
			if sentAfterVerdict != 0 && !idle {
				t.Fatalf("%d calls sent to the victim after it was seen stalled", sentAfterVerdict)
			}
			// Within the window each client starts at most window/pause + 1
			// calls, and round robin sends one in three to the victim (+2
			// for the turn's rounding). The limit is 8 × the answer time,
			// so it grows on a loaded machine (-race, CI): the bound follows
			// the window seen.
			maxCaught := int64(atKill.Inflight) + int64(float64(workers)*(float64(window)/float64(tc.pause)+1)/3) + 2
			if n > maxCaught {
				t.Errorf("%d calls failed: more than the %d in flight on the victim at the freeze + the %d its window (%v) allows",
					n, atKill.Inflight, maxCaught-int64(atKill.Inflight), window)
			}
			if logs.count("qrpc server stalled: calls in flight and no answer, new calls go to other servers", victim.addr) != 1 {
				t.Error("no single stall line for the victim in the log")
			}
			// Nothing fails after that: over the next 100 calls, within
			// the ejection (no trial call yet).
			before := failed.Load()
			progress(t, "calls after the ejection", oks.Load, 100, 30*time.Second, func() bool {
				in, _ := peerState(p, victim.addr)
				return time.Until(in.EjectedUntil) < 100*time.Millisecond
			})
			if d := failed.Load() - before; d != 0 {
				t.Fatalf("%d calls failed after the ejection", d)
			}
		})
	}
}

// TestPoolStallSlowServer: a server slower than Stall (400 ms calls,
// default Stall 200 ms) is alive: it loses no call and is not ejected, it
// only gets fewer new ones while it is stalled. With every server that
// slow, calls still go to all of them.
func TestPoolStallSlowServer(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(3)
	f.srvs[1].delay.Store(400)
	p := f.dial(t, addrs, nil)
	// run loads the pool until enough holds (the window is the calls it
	// takes, not a time).
	run := func(what string, enough func() bool) {
		var failed, done atomic.Int64
		var last atomic.Pointer[error]
		stop := make(chan struct{})
		wg := load(12, stop, func() error {
			_, err := poolCall(p, 5*time.Second, "work", "")
			return err
		}, func(err error, _ time.Time) {
			done.Add(1)
			if err != nil {
				failed.Add(1)
				last.Store(&err)
			}
		})
		testwait.Until(t, what+": enough calls", 60*time.Second, enough)
		close(stop)
		wg.Wait()
		if n := failed.Load(); n != 0 {
			t.Fatalf("%s: %d calls failed, last: %v", what, n, *last.Load())
		}
		for _, in := range p.Peers() {
			if in.State != qrpc.PeerUp || in.Failures != 0 {
				t.Fatalf("%s: %+v", what, in)
			}
		}
	}
	// The slow server's 400 ms calls overlap the stall limit many times.
	run("one slow server", func() bool { return f.srvs[1].hits.Load() >= 8 })
	slow := f.srvs[1].hits.Load()
	fast := f.srvs[0].hits.Load()
	t.Logf("one slow server: slow %d calls, fast %d", slow, fast)
	if slow < 4 {
		t.Fatalf("the slow server took %d calls", slow)
	}
	for _, m := range f.srvs {
		m.delay.Store(400)
		m.hits.Store(0)
	}
	run("every server slow", func() bool {
		for _, m := range f.srvs {
			if m.hits.Load() < 10 {
				return false
			}
		}
		return true
	})
	for _, m := range f.srvs {
		if h := m.hits.Load(); h < 8 {
			t.Errorf("every server slow: %s took %d calls", m.addr, h)
		}
	}
}
