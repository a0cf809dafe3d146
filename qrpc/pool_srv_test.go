package qrpc_test

import (
	"errors"
	"math"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

const srvName = "_qrpc._udp.svc.qrpc.test"

// srvOf is the SRV record of a fleet member: its target is certs.LocalTarget,
// the name its certificate is for, so that the TLS name checked is the
// target's (no server name is configured).
func srvOf(mem *member, prio, weight uint16) dnstest.SRV {
	_, port, _ := net.SplitHostPort(mem.addr)
	n, _ := strconv.Atoi(port)
	return dnstest.SRV{Priority: prio, Weight: weight, Port: uint16(n), Target: certs.LocalTarget}
}

// srvFleet starts n servers on 127.0.0.1 and a DNS server that knows
// certs.LocalTarget.
func srvFleet(t *testing.T, n int) (*fleet, *dnstest.Server) {
	f := newFleet(t)
	for range n {
		f.add("127.0.0.1:0")
	}
	dns := dnstest.Start(t, srvName+".")
	dns.SetA(certs.LocalTarget, "127.0.0.1")
	return f, dns
}

func allUp(p *qrpc.Pool, n int) func() bool {
	return func() bool {
		in := p.Peers()
		if len(in) != n {
			return false
		}
		for _, i := range in {
			if i.State != qrpc.PeerUp {
				return false
			}
		}
		return true
	}
}

// TestPoolSRVWeights: SRV weights 3:1 split calls 3:1 over 4000 calls
// from 16 callers. round_robin: within 5 standard deviations of a
// binomial count (its weighted order is exact, in fact). p2c: its draws
// follow the weights, but its latency comparison adds variance between
// runs (pool_tier.go): one run's share of the weight-3 server was 0.72 to
// 0.78 in 12 runs beside stress-ng, 0.68 to 0.84 in 15 beside the race
// suite, and 0.64 once in CI; within 0.15 of 0.75 it is still far from
// the 0.5 of servers drawn without their weights. least_inflight is
// checked by TestTierLeastInflight.
func TestPoolSRVWeights(t *testing.T) {
	for _, bal := range []qrpc.Balance{qrpc.RoundRobin, qrpc.P2C} {
		t.Run(bal.String(), func(t *testing.T) {
			f, dns := srvFleet(t, 2)
			a, b := f.srvs[0], f.srvs[1]
			dns.SetSRV(srvName, srvOf(a, 10, 3), srvOf(b, 10, 1))
			p := f.dial(t, []string{srvName}, &qrpc.PoolConfig{Balance: bal, Resolver: dns.Addr})
			testwait.Until(t, "both servers up", 10*time.Second, allUp(p, 2))
			for _, in := range p.Peers() {
				if in.Priority != 10 || (in.Weight != 3 && in.Weight != 1) {
					t.Fatalf("peer %+v", in)
				}
			}
			const n = 4000
			ha, hb := a.hits.Load(), b.hits.Load()
			var done atomic.Int64
			stop := make(chan struct{})
			var firstErr atomic.Pointer[error]
			wg := load(16, stop, func() error {
				_, err := poolCall(p, 5*time.Second, "who", "")
				return err
			}, func(err error, _ time.Time) {
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
				done.Add(1)
			})
			progress(t, "calls", done.Load, n, 60*time.Second, nil)
			close(stop)
			wg.Wait()
			if e := firstErr.Load(); e != nil {
				t.Fatalf("a call failed: %v", *e)
			}
			da, db := a.hits.Load()-ha, b.hits.Load()-hb
			total := float64(da + db)
			sd := math.Sqrt(total * 0.75 * 0.25)
			t.Logf("%s: weight 3 took %d, weight 1 took %d: %.3f (binomial 5 sd: ± %.3f)", bal, da, db, float64(da)/total, 5*sd/total)
			bound := 5 * sd / total
			if bal == qrpc.P2C {
				bound = 0.15
			}
			if math.Abs(float64(da)/total-0.75) > bound {
				t.Fatalf("split %d:%d is not 3:1", da, db)
			}
		})
	}
}

// TestPoolSRVPriority: the priority-20 server takes no call while a
// priority-10 server is up, takes them all once both priority-10 servers
// are down, and gives them back when they return.
func TestPoolSRVPriority(t *testing.T) {
	f, dns := srvFleet(t, 3)
	a1, a2, b := f.srvs[0], f.srvs[1], f.srvs[2]
	dns.SetSRV(srvName, srvOf(a1, 10, 1), srvOf(a2, 10, 1), srvOf(b, 20, 1))
	p := f.dial(t, []string{srvName}, &qrpc.PoolConfig{
		Resolver: dns.Addr,
		Eject:    200 * time.Millisecond,
		Check:    qrpc.HealthCheck{Method: "hc", Interval: 50 * time.Millisecond, Timeout: 200 * time.Millisecond},
	})
	testwait.Until(t, "every server up", 10*time.Second, allUp(p, 3))
	var done atomic.Int64
	stop := make(chan struct{})
	wg := load(4, stop, func() error {
		_, err := poolCall(p, 300*time.Millisecond, "who", "")
		return err
	}, func(error, time.Time) { done.Add(1) })
	defer func() { close(stop); wg.Wait() }()
	hb := b.hits.Load()
	progress(t, "calls on the first tier", done.Load, 300, 30*time.Second, nil)
	if b.hits.Load() != hb {
		t.Fatalf("the priority-20 server took %d calls while both priority-10 ones were up", b.hits.Load()-hb)
	}
	a1.kill()
	testwait.Until(t, "a1 ejected", 10*time.Second, func() bool {
		in, _ := peerState(p, a1.addr)
		return in.State == qrpc.PeerEjected
	})
	hb = b.hits.Load()
	h2 := a2.hits.Load()
	n0 := done.Load()
	progress(t, "calls with one priority-10 server", done.Load, n0+300, 30*time.Second, nil)
	if b.hits.Load() != hb || a2.hits.Load() < h2+250 {
		t.Fatalf("with a2 up, b took %d calls and a2 %d", b.hits.Load()-hb, a2.hits.Load()-h2)
	}
	a2.kill()
	testwait.Until(t, "the priority-20 server takes the calls", 10*time.Second, func() bool {
		return b.hits.Load() > hb+300
	})
	a1.restart()
	a2.restart()
	testwait.Until(t, "the priority-10 servers back", 20*time.Second, func() bool {
		for _, m := range []*member{a1, a2} {
			if in, _ := peerState(p, m.addr); in.State != qrpc.PeerUp {
				return false
			}
		}
		return true
	})
	hb = b.hits.Load()
	h1, h2 := a1.hits.Load(), a2.hits.Load()
	n0 = done.Load()
	progress(t, "calls after the return", done.Load, n0+300, 30*time.Second, nil)
	// A call sent before the return was seen may still land on b.
	if got := b.hits.Load() - hb; got > 8 {
		t.Fatalf("b took %d of the calls after the priority-10 servers came back", got)
	}
	if a1.hits.Load()-h1 < 50 || a2.hits.Load()-h2 < 50 {
		t.Fatalf("after the return: a1 %d, a2 %d calls", a1.hits.Load()-h1, a2.hits.Load()-h2)
	}
}

// TestPoolSRVChange: a changed SRV record set moves the calls: a server
// added takes its share, one removed takes none, a weight changed moves
// the split.
func TestPoolSRVChange(t *testing.T) {
	f, dns := srvFleet(t, 2)
	a, b := f.srvs[0], f.srvs[1]
	dns.SetSRV(srvName, srvOf(a, 0, 1))
	p := f.dial(t, []string{srvName}, &qrpc.PoolConfig{Resolver: dns.Addr, Resolve: 100 * time.Millisecond})
	var done, failed atomic.Int64
	stop := make(chan struct{})
	wg := load(4, stop, func() error {
		_, err := poolCall(p, 5*time.Second, "who", "")
		return err
	}, func(err error, _ time.Time) {
		done.Add(1)
		if err != nil && failed.Add(1) == 1 {
			t.Logf("first failure: %v", err)
		}
	})
	defer func() { close(stop); wg.Wait() }()
	progress(t, "calls on one server", done.Load, 100, 30*time.Second, nil)
	if b.hits.Load() != 0 {
		t.Fatal("b took calls before its record")
	}
	dns.SetSRV(srvName, srvOf(a, 0, 1), srvOf(b, 0, 1))
	testwait.Until(t, "b takes calls", 10*time.Second, func() bool { return b.hits.Load() > 50 })
	dns.SetSRV(srvName, srvOf(b, 0, 1))
	testwait.Until(t, "a removed", 10*time.Second, func() bool {
		_, ok := peerState(p, a.addr)
		return !ok
	})
	ha := a.hits.Load()
	n0 := done.Load()
	progress(t, "calls after the removal", done.Load, n0+200, 30*time.Second, nil)
	if a.hits.Load() != ha {
		t.Fatal("a removed server still takes calls")
	}
	// Back with weights 1:3 on the same connections.
	dns.SetSRV(srvName, srvOf(a, 0, 1), srvOf(b, 0, 3))
	testwait.Until(t, "a back, weighted", 10*time.Second, func() bool {
		in, ok := peerState(p, a.addr)
		inb, _ := peerState(p, b.addr)
		return ok && in.State == qrpc.PeerUp && inb.Weight == 3
	})
	ha, hb := a.hits.Load(), b.hits.Load()
	n0 = done.Load()
	progress(t, "calls with weights 1:3", done.Load, n0+2000, 60*time.Second, nil)
	da, db := a.hits.Load()-ha, b.hits.Load()-hb
	total := float64(da + db)
	t.Logf("1:3: %d:%d", da, db)
	if math.Abs(float64(db)-0.75*total) > 5*math.Sqrt(total*0.75*0.25) {
		t.Fatalf("split %d:%d after the weight change, want 1:3", da, db)
	}
	if failed.Load() != 0 {
		t.Fatalf("%d calls failed on the way", failed.Load())
	}
}

// TestPoolSRVBadAnswers: an SRV name with no record, or that does not
// exist, or whose targets do not resolve, fails to connect as a host name
// that does not resolve does; a pool whose SRV name goes bad keeps its
// servers, as with A records.
func TestPoolSRVBadAnswers(t *testing.T) {
	f, dns := srvFleet(t, 1)
	dial := func(addr string) error {
		_, err := qrpc.DialPool(t.Context(), []string{addr}, f.config(&qrpc.PoolConfig{Resolver: dns.Addr}))
		return err
	}
	plain := dial("nowhere.qrpc.test:7000")
	want := qrpc.Classify(plain)
	if want.Word != qrpc.WordConnect || want.Reason != qrpc.ReasonNoHost {
		t.Fatalf("a plain name that does not resolve: %v", plain)
	}
	dns.SetSRV("_none._udp.qrpc.test")
	dns.SetSRV("_dangling._udp.qrpc.test", dnstest.SRV{Port: 7000, Target: "gone.qrpc.test"})
	dns.SetSRV("_dot._udp.qrpc.test", dnstest.SRV{Port: 7000, Target: "."})
	for _, name := range []string{"_nxdomain._udp.qrpc.test", "_none._udp.qrpc.test", "_dangling._udp.qrpc.test", "_dot._udp.qrpc.test"} {
		err := dial(name)
		if got := qrpc.Classify(err); got.Word != want.Word || got.Reason != want.Reason || !errors.Is(err, qrpc.ErrDial) {
			t.Errorf("%s: %v (%+v), want %+v", name, err, got, want)
		}
	}
	// Re-resolution: the name goes bad, the servers stay.
	a := f.srvs[0]
	dns.SetSRV(srvName, srvOf(a, 0, 1))
	p := f.dial(t, []string{srvName}, &qrpc.PoolConfig{Resolver: dns.Addr, Resolve: 50 * time.Millisecond})
	for i, bad := range []func(){func() { dns.SetSRV(srvName) }, func() { dns.Remove(srvName) }} {
		bad()
		q := dns.Queries()
		testwait.Until(t, "re-resolved", 10*time.Second, func() bool { return dns.Queries() > q+2 })
		if _, err := poolCall(p, 5*time.Second, "who", ""); err != nil {
			t.Fatalf("bad answer %d: %v", i, err)
		}
		if in, ok := peerState(p, a.addr); !ok || in.State != qrpc.PeerUp {
			t.Fatalf("bad answer %d: server %+v", i, in)
		}
	}

}

// TestPoolThrottle: servers that answer with an overload code (a throttle
// code) make the pool reject calls locally, "unavailable: throttled",
// counted by the observer and never sent. Once the servers answer again
// (code 0, or any code not listed, is an accept), the few calls let
// through are accepted, and the shedding ends as the window slides (the
// pool's clock moved on).
func TestPoolThrottle(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	rec := newRecorder()
	p := f.dial(t, addrs, &qrpc.PoolConfig{Throttle: qrpc.Throttle{K: 2, Codes: []uint32{8}}, Observer: rec})
	advance := qrpc.ShiftPoolClockForTest(p)
	for _, m := range f.srvs {
		m.code.Store(8)
	}
	run := func(n int) (throttled, answered int) {
		for range n {
			resp, err := poolCall(p, 5*time.Second, "busy", "")
			switch {
			case errors.Is(err, qrpc.ErrThrottled):
				if s := qrpc.ErrorString(err); s != "unavailable: throttled" {
					t.Fatalf("error %q", s)
				}
				if !errors.Is(err, qrpc.ErrUnavailable) {
					t.Fatal("not unavailable")
				}
				throttled++
			case err != nil:
				t.Fatal(err)
			default:
				if resp.Code != f.srvs[0].code.Load() {
					t.Fatalf("code %d", resp.Code)
				}
				answered++
			}
		}
		return throttled, answered
	}
	th, an := run(400)
	t.Logf("overloaded: %d of 400 throttled, %d answered", th, an)
	// With no accepts, p = requests / (requests + 1): after the first few
	// calls nearly every call is shed.
	if th < 350 {
		t.Fatalf("only %d of 400 throttled", th)
	}
	if int64(th) != rec.throttled.Load() {
		t.Fatalf("observer counted %d, want %d", rec.throttled.Load(), th)
	}
	hits := f.srvs[0].hits.Load() + f.srvs[1].hits.Load()
	if hits != int64(an) {
		t.Fatalf("servers saw %d calls, %d answered: a throttled call was sent", hits, an)
	}
	for _, m := range f.srvs {
		m.code.Store(0)
	}
	// Still in the window: most calls are shed (those let through, about
	// 1 %, are accepted).
	th, an = run(400)
	t.Logf("answering, same window: %d of 400 throttled, %d answered", th, an)
	if th < 300 {
		t.Fatalf("answering in the same window: %d throttled, %d answered", th, an)
	}
	// Each step: 20 s later, 200 calls. The calls shed count as requests
	// (the book's rule), so the admitted share grows about K-fold per
	// window (q' = K·q): the release takes a few windows from deep
	// shedding, and ends. From a window with no accept at all, a call in
	// about 1200 gets through until the first answers come back (the
	// draws are random). Measured over 150 runs: a median of 23 steps,
	// the longest 60. The bound is an hour of the pool's clock, 180.
	var shares []float64
	for len(shares) < 180 {
		advance(20 * time.Second)
		th, _ := run(200)
		shares = append(shares, float64(th)/200)
		if th == 0 {
			break
		}
	}
	t.Logf("answering, share shed every 20 s: %.2f", shares)
	if shares[0] < 0.5 {
		t.Fatalf("released at once: %.2f", shares)
	}
	if shares[len(shares)-1] != 0 {
		t.Fatalf("not released after %d steps: %.2f", len(shares), shares)
	}
}

// TestPoolThrottleTimeouts: calls that time out on a frozen server are
// rejects: throttling engages without any overload code.
func TestPoolThrottleTimeouts(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(1)
	p := f.dial(t, addrs, &qrpc.PoolConfig{Throttle: qrpc.Throttle{K: 2}})
	if _, err := poolCall(p, 5*time.Second, "who", ""); err != nil {
		t.Fatal(err)
	}
	f.srvs[0].freeze()
	timeouts, throttled := 0, 0
	for range 40 {
		_, err := poolCall(p, 30*time.Millisecond, "who", "")
		switch {
		case errors.Is(err, qrpc.ErrThrottled):
			throttled++
		case errors.Is(err, qrpc.ErrTimeout):
			timeouts++
		default:
			t.Fatalf("frozen server: %v", err)
		}
	}
	t.Logf("frozen: %d timeouts, %d throttled of 40", timeouts, throttled)
	if throttled < 20 {
		t.Fatalf("%d of 40 throttled after timeouts", throttled)
	}
}
