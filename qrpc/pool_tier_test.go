package qrpc

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"
)

// tierPool is benchPool with SRV priorities and weights (prio, weight per
// server, in address order).
func tierPool(t *testing.T, b Balance, meta ...srvMeta) *Pool {
	p := benchPool(t, len(meta), b)
	peers := p.set.Load().peers
	for i, m := range meta {
		peers[i].setMeta(m)
	}
	p.hasSRV = true
	p.set.Store(&peerSet{peers: peers, tiers: buildTiers(peers)})
	return p
}

func TestIsSRVName(t *testing.T) {
	for a, want := range map[string]bool{
		"_qrpc._udp.svc.example.internal":  true,
		"_qrpc._udp.svc.example.internal.": true,
		"_a._b.c":                          true,
		"_qrpc._udp":                       false,
		"qrpc._udp.svc.example":            false,
		"_qrpc.udp.svc.example":            false,
		"_qrpc._udp.svc:8443":              false,
		"_._udp.svc":                       false,
		"_qrpc._udp..svc":                  false,
		"svc.example.internal":             false,
	} {
		if got := isSRVName(a); got != want {
			t.Errorf("isSRVName(%q) = %v", a, got)
		}
	}
}

// TestTierSchedule: the weighted round-robin order spreads a heavy
// server's turns, reduces weights by their gcd and scales large ones.
func TestTierSchedule(t *testing.T) {
	p := tierPool(t, RoundRobin, srvMeta{weight: 3}, srvMeta{weight: 1})
	if got := p.set.Load().tiers[0].sched; !slices.Equal(got, []uint16{0, 0, 1, 0}) {
		t.Fatalf("3:1 order %v", got)
	}
	p = tierPool(t, RoundRobin, srvMeta{weight: 300}, srvMeta{weight: 100})
	if got := p.set.Load().tiers[0].sched; len(got) != 4 {
		t.Fatalf("300:100 order %v", got)
	}
	p = tierPool(t, RoundRobin, srvMeta{weight: 65535}, srvMeta{weight: 1}, srvMeta{weight: 0})
	tr := p.set.Load().tiers[0]
	if len(tr.sched) > maxSched+2 || len(tr.sched) < maxSched {
		t.Fatalf("scaled order of %d turns", len(tr.sched))
	}
	n := [3]int{}
	for _, i := range tr.sched {
		n[i]++
	}
	if n[1] != 1 || n[2] != 1 {
		t.Fatalf("turns %v: weights 1 and 0 get one turn each", n)
	}
	// Equal weights: no weighted tier, the plain balancer.
	p = tierPool(t, RoundRobin, srvMeta{weight: 5}, srvMeta{weight: 5})
	if p.set.Load().tiers[0].weighted {
		t.Fatal("equal weights make a weighted tier")
	}
}

// TestTierFailover: calls go to the lowest priority's servers; the next
// tier only when every server before it is down (ejected or not
// connected), and back when one returns.
func TestTierFailover(t *testing.T) {
	p := tierPool(t, RoundRobin, srvMeta{prio: 1, weight: 1}, srvMeta{prio: 1, weight: 1}, srvMeta{prio: 2, weight: 1})
	peers := p.set.Load().peers
	count := func() map[string]int {
		c := map[string]int{}
		for range 100 {
			pr, _ := p.pick(nil, nil, false, &pickClock{})
			if pr == nil {
				c["none"]++
				continue
			}
			c[pr.addr]++
		}
		return c
	}
	if c := count(); c[peers[2].addr] != 0 || c[peers[0].addr] != 50 {
		t.Fatalf("all up: %v", c)
	}
	p.transition(peers[0], event{kind: evFailure})
	p.transition(peers[0], event{kind: evFailure})
	p.transition(peers[0], event{kind: evFailure})
	if c := count(); c[peers[2].addr] != 0 || c[peers[1].addr] != 100 {
		t.Fatalf("one of the first tier ejected: %v", c)
	}
	clientOf(peers[1]).slots[0].cur.Store(nil) // not connected
	if c := count(); c[peers[2].addr] != 100 {
		t.Fatalf("the first tier down: %v", c)
	}
	// A call refused by the only second-tier server has nowhere to go,
	// unless a retry may go back to it.
	var ex exclude
	ex.add(peers[2])
	if pr, _ := p.pick(nil, &ex, false, &pickClock{}); pr != nil {
		t.Fatalf("excluded, yet %s", pr.addr)
	}
	if pr, _ := p.pick(nil, &ex, true, &pickClock{}); pr != peers[2] {
		t.Fatalf("relaxed retry: %v", pr)
	}
	p.transition(peers[0], event{kind: evCheckOK})
	if c := count(); c[peers[0].addr] != 100 {
		t.Fatalf("a first-tier server back: %v", c)
	}
}

// TestTierLeastInflight: with weights 3:1, the lowest (in flight + 1) /
// weight wins: idle, the heavy server; busy, calls in flight settle 3:1.
func TestTierLeastInflight(t *testing.T) {
	p := tierPool(t, LeastInflight, srvMeta{weight: 3}, srvMeta{weight: 1})
	a, b := p.set.Load().peers[0], p.set.Load().peers[1]
	now := time.Now()
	for range 40 {
		pr, _ := p.pick(nil, nil, false, &pickClock{t: now})
		pr.startCall(now) // never ends: calls pile up
	}
	if a.inflight.Load() != 30 || b.inflight.Load() != 10 {
		t.Fatalf("in flight %d:%d, want 30:10", a.inflight.Load(), b.inflight.Load())
	}
}

// TestTierP2CDraws: idle servers (no cost measured) split p2c's calls by
// the weighted draws alone: 3:1.
func TestTierP2CDraws(t *testing.T) {
	p := tierPool(t, P2C, srvMeta{weight: 3}, srvMeta{weight: 1})
	a := p.set.Load().peers[0]
	const n = 40000
	got := 0
	for range n {
		if pr, _ := p.pick(nil, nil, false, &pickClock{}); pr == a {
			got++
		}
	}
	sd := math.Sqrt(n * 0.75 * 0.25)
	t.Logf("p2c idle: %.4f to weight 3", float64(got)/n)
	if math.Abs(float64(got)-0.75*n) > 5*sd {
		t.Fatalf("%d of %d to the weight-3 server", got, n)
	}
}

// TestTierHashWeighted: weighted rendezvous hashing gives the weight-3
// server 3/4 of the keys, and a key's server does not change while both
// are up.
func TestTierHashWeighted(t *testing.T) {
	p := tierPool(t, Hash, srvMeta{weight: 3}, srvMeta{weight: 1})
	a := p.set.Load().peers[0]
	const n = 20000
	got := 0
	for i := range n {
		key := []byte("user-" + strconv.Itoa(i))
		pr, _ := p.pick(key, nil, false, &pickClock{})
		if pr2, _ := p.pick(key, nil, false, &pickClock{}); pr2 != pr {
			t.Fatal("a key moved")
		}
		if pr == a {
			got++
		}
	}
	sd := math.Sqrt(n * 0.75 * 0.25)
	t.Logf("hash: %.4f of the keys to weight 3", float64(got)/n)
	if math.Abs(float64(got)-0.75*n) > 5*sd {
		t.Fatalf("%d of %d keys to the weight-3 server", got, n)
	}
}

// TestSRVResolve: an SRV name's targets resolve to their addresses on the
// records' ports, with their priorities and weights, verified against the
// target's name (the pool's server name, when set, wins); a target that
// does not resolve is left out.
func TestSRVResolve(t *testing.T) {
	targets := []target{{host: "_qrpc._udp.svc.test", srv: true}, {host: "plain.test", port: "9000"}}
	ips := map[string][]netip.Addr{
		"a.test":     {netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")},
		"b.test":     {netip.MustParseAddr("10.0.1.1")},
		"plain.test": {netip.MustParseAddr("10.0.2.1")},
	}
	srvs := []*net.SRV{
		{Target: "b.test.", Port: 7001, Priority: 20, Weight: 1},
		{Target: "a.test.", Port: 7000, Priority: 10, Weight: 3},
		{Target: "gone.test.", Port: 7002, Priority: 10, Weight: 1},
	}
	lookup := func(_ context.Context, h string) ([]netip.Addr, error) {
		if a, ok := ips[h]; ok {
			return a, nil
		}
		return nil, fmt.Errorf("no such host")
	}
	addrs, names, meta, err := resolveAll(t.Context(), targets, time.Second, lookup, func(context.Context, string) ([]*net.SRV, error) {
		return srvs, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.1.1:7001", "10.0.2.1:9000"}
	if !slices.Equal(addrs, want) {
		t.Fatalf("addresses %v, want %v", addrs, want)
	}
	p := benchPool(t, 1, RoundRobin)
	for addr, w := range map[string]struct {
		name string
		m    srvMeta
	}{
		"10.0.0.1:7000": {"a.test", srvMeta{10, 3, 2}},
		"10.0.0.2:7000": {"a.test", srvMeta{10, 3, 2}},
		"10.0.1.1:7001": {"b.test", srvMeta{20, 1, 1}},
		"10.0.2.1:9000": {"plain.test", plainMeta},
	} {
		if got := p.peerConf(addr, names).ServerName; got != w.name {
			t.Errorf("%s: server name %q, want %q", addr, got, w.name)
		}
		if meta[addr] != w.m {
			t.Errorf("%s: %+v, want %+v", addr, meta[addr], w.m)
		}
	}
	p.conf.ServerName = "set.test"
	if got := p.peerConf("10.0.0.1:7000", names).ServerName; got != "set.test" {
		t.Errorf("server name set: %q", got)
	}
}
