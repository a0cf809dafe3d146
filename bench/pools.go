package main

// Pools: the same unary calls from Lua through a pool of three
// qrpc servers and through a pool of one, all on this machine. What the
// pool adds per call (picking a server, counting calls in flight, one
// QUIC connection per server) must not cost throughput.
//
// Both pools are connections of the same worker, called in alternating
// blocks within one request (50 sequential calls, or 10 calls from each
// of 100 light threads; the order flipped every round:
// bench/lua/bench_pools.lua), over several runs, so that a shared
// machine's drifting load weighs on both; the worker's and the servers'
// CPU clocks are read around each block. Two set-ups:
//   - the library's overhead (the target): one server process with three
//     listening sockets (three qrpc servers) as the pool of three, and one
//     of those sockets as the pool of one. The server side is the same Go
//     runtime for both, so what differs is the client: three QUIC
//     connections and the pool's spreading vs one connection.
//   - three server processes vs one (for information): on a machine with
//     2 CPUs this also measures waking three idle Go runtimes in turn, one
//     per call, instead of one kept warm: the machine's cost, not the
//     library's, so no target is drawn on it.

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
)

const (
	secBalance     = "Pools: balance = \"p2c\" vs \"round_robin\", 3 even servers (3 listeners of one process)"
	secBalanceSlow = "Pools: balancers with one of 3 server processes paused 100 ms every 300 ms (SIGSTOP; for information)"
	secPools       = "Pools: a pool of 3 servers vs 1 server, same server process (3 listeners vs 1 of them)"
	secPoolsProc   = "Pools: 3 server processes vs 1 server process (same machine; for information)"
	secPoolsConn   = "Pools: a pool of 3 servers vs 1 server over 3 QUIC connections (conns = 3), same server process: what the pool itself costs"
	secShared      = "Pools: a shared pool (shared = lua_shared_dict) vs the same pool unshared, 3 servers (3 listeners of one process)"
	poolTarget     = "≥ 0.95"
	sharedTarget   = "≤ 1.03" // worker CPU per call
)

// poolMode is one pool's calls in a poolRun, in seconds.
type poolMode struct {
	Secs float64 `json:"secs"`
	CPU  float64 `json:"cpu"` // the nginx worker, all its threads
	Srv  float64 `json:"srv"` // the server processes
}

// poolRun is one answer of GET /bench/pools: a is the pool of 3, b the
// pool of 1.
type poolRun struct {
	Calls  int      `json:"calls"`
	Errors int      `json:"errors"`
	A      poolMode `json:"a"`
	B      poolMode `json:"b"`
}

func (r poolRun) rate(m poolMode) float64 { return float64(r.Calls) / m.Secs }
func (r poolRun) us(s float64) float64    { return s / float64(r.Calls) * 1e6 }
func (r poolRun) rateRatio() float64      { return r.B.Secs / r.A.Secs }
func (r poolRun) aRate() float64          { return r.rate(r.A) }
func (r poolRun) bRate() float64          { return r.rate(r.B) }
func (r poolRun) aCPU() float64           { return r.us(r.A.CPU) }
func (r poolRun) bCPU() float64           { return r.us(r.B.CPU) }
func (r poolRun) aSrv() float64           { return r.us(r.A.Srv) }
func (r poolRun) bSrv() float64           { return r.us(r.B.Srv) }
func (r poolRun) cpuRatio() float64       { return r.A.CPU / r.B.CPU }
func (r poolRun) srvRatio() float64       { return r.A.Srv / r.B.Srv }
func (r poolRun) allRatio() float64       { return (r.A.CPU + r.A.Srv) / (r.B.CPU + r.B.Srv) }
func (r poolRun) aAll() float64           { return r.us(r.A.CPU + r.A.Srv) }
func (r poolRun) bAll() float64           { return r.us(r.B.CPU + r.B.Srv) }
func ratioSpread(runs []poolRun, f func(poolRun) float64) string {
	v := values(runs, f)
	sort.Float64s(v)
	return fmt.Sprintf("%.2f–%.2f", v[0], v[len(v)-1])
}

// startServers runs one server process with n listening sockets.
func startServers(dir string, pair certs.Pair, n int) (*child, []string, error) {
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := os.WriteFile(certFile, pair.CertPEM, 0o644); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(keyFile, pair.KeyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	c, err := startChild("-serve", certFile+","+keyFile, "-listeners", strconv.Itoa(n))
	if err != nil {
		return nil, nil, err
	}
	addrs := strings.Split(c.addr, ",")
	if len(addrs) != n {
		c.stop()
		return nil, nil, fmt.Errorf("server process: %d addresses, want %d: %q", len(addrs), n, c.addr)
	}
	return c, addrs, nil
}

// poolRun runs calls through pool a (three) and pool b (one); oneConns is
// b's QUIC connections per server (the conns option; 0 or 1: one).
// bal: a's and b's balance (or the query's extra parameters, when one).
func (n *nginx) poolRun(three, one []string, oneConns int, pids []int, calls, c, block int, bal ...string) (poolRun, error) {
	var r poolRun
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	q := ""
	switch len(bal) {
	case 2:
		q = "&abal=" + bal[0] + "&bbal=" + bal[1]
	case 1:
		q = bal[0]
	}
	body, err := n.get(fmt.Sprintf("/bench/pools?a=%s&b=%s&bconns=%d&pids=%s&n=%d&c=%d&block=%d&size=100%s",
		strings.Join(three, ","), strings.Join(one, ","), oneConns, strings.Join(ps, ","), calls, c, block, q))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return r, fmt.Errorf("bad /bench/pools answer %q: %w", body, err)
	}
	if r.Errors > 0 || r.Calls == 0 {
		return r, fmt.Errorf("/bench/pools: %d of %d calls failed; error.log:\n%s", r.Errors, 2*r.Calls, tail(filepath.Join(n.dir, "error.log")))
	}
	return r, nil
}

func figurePools(e *env, p params, t *table) error {
	procAddrs, procPIDs := []string{e.qrpcAddr}, []int{e.srvPID}
	for range 2 {
		srv, err := startServerProcess(e.dir, e.pair)
		if err != nil {
			return fmt.Errorf("another qrpc server: %w", err)
		}
		defer srv.stop()
		procAddrs, procPIDs = append(procAddrs, srv.addr), append(procPIDs, srv.pid)
	}
	multi, multiAddrs, err := startServers(e.dir, e.pair, 3)
	if err != nil {
		return fmt.Errorf("a qrpc server process with 3 listeners: %w", err)
	}
	defer multi.stop()
	// The third set-up gives the pool of one server as many QUIC
	// connections as the pool of three has: what is left between them is
	// the pool's own work (picking, counting), not the batching that one
	// connection carrying every call in flight gets and three do not.
	// Concurrent calls only: sequential calls do not batch.
	setups := []struct {
		sec        string
		three, one []string
		oneConns   int
		pids       []int
		target     string
		seq        bool
		bal        []string
	}{
		{secPools, multiAddrs, multiAddrs[:1], 1, []int{multi.pid}, poolTarget, true, nil},
		{secPoolsConn, multiAddrs, multiAddrs[:1], 3, []int{multi.pid}, "", false, nil},
		{secPoolsProc, procAddrs, procAddrs[:1], 1, procPIDs, "", true, nil},
		// p2c against round-robin on the same three even servers: what
		// drawing two servers and weighing their latency costs.
		{secBalance, multiAddrs, multiAddrs, 1, []int{multi.pid}, poolTarget, true, []string{"p2c", "round_robin"}},
		// the same pool shared through a lua_shared_dict and not: what
		// the sync on the call path costs
		{secShared, multiAddrs, multiAddrs, 1, []int{multi.pid}, poolTarget, true, []string{"&ashared=1"}},
	}
	rows := []struct {
		name            string
		calls, c, block int
	}{
		{fmt.Sprintf("100 B, %d sequential calls per pool", p.poolSeqN), p.poolSeqN, 1, 50},
		{fmt.Sprintf("100 B, %d calls per pool from %d light threads", p.poolParN, p.conc), p.poolParN, p.conc, 10 * p.conc},
	}
	runs := max(p.runs, 3)
	for _, s := range setups {
		for _, r := range rows {
			if r.c <= 1 && !s.seq {
				continue
			}
			var got []poolRun
			for i := 0; i < runs; i++ {
				pr, err := e.nginx.poolRun(s.three, s.one, s.oneConns, s.pids, r.calls, r.c, r.block, s.bal...)
				if err != nil {
					return fmt.Errorf("%s: %w", r.name, err)
				}
				log.Printf("pools: %s, %s: 3 servers %.0f calls/s, 1 server %.0f calls/s (%.3f); CPU per call: worker %.1f vs %.1f µs, servers %.1f vs %.1f µs",
					s.sec[:24], r.name, pr.aRate(), pr.bRate(), pr.rateRatio(), pr.aCPU(), pr.bCPU(), pr.aSrv(), pr.bSrv())
				got = append(got, pr)
			}
			name := r.name
			if len(s.bal) == 2 {
				name = strings.Replace(name, "per pool", "per balancer", 1)
			}
			tr := row{section: s.sec, name: fmt.Sprintf("%s × %d runs: throughput (runs' ratios %s)", name, runs, ratioSpread(got, poolRun.rateRatio)),
				subject: fmt.Sprintf("%.0f calls/s", medianBy(got, poolRun.aRate)), baseline: fmt.Sprintf("%.0f calls/s", medianBy(got, poolRun.bRate)),
				ratio: medianBy(got, poolRun.rateRatio), ratioLabel: "throughput ratio"}
			if s.target != "" {
				tr = tr.withTarget(s.target)
			}
			t.add(tr)
			for _, c := range []struct {
				what      string
				a, b, rat func(poolRun) float64
			}{
				{"worker CPU per call", poolRun.aCPU, poolRun.bCPU, poolRun.cpuRatio},
				{"server processes' CPU per call", poolRun.aSrv, poolRun.bSrv, poolRun.srvRatio},
				{"worker + servers CPU per call", poolRun.aAll, poolRun.bAll, poolRun.allRatio},
			} {
				cr := cpuRow(s.sec, fmt.Sprintf("%s: %s (runs' ratios %s)", name, c.what, ratioSpread(got, c.rat)), medianBy(got, c.a), medianBy(got, c.b))
				cr.ratio = medianBy(got, c.rat)
				if s.sec == secShared && c.what == "worker CPU per call" {
					cr = cr.withTarget(sharedTarget)
				}
				t.add(cr)
			}
		}
	}
	return nil
}

// figureBalance: the balancers with one of three server processes paused.
func figureBalance(e *env, p params, t *table) error {
	addrs, pids := []string{}, []int{}
	for range 3 {
		srv, err := startServerProcess(e.dir, e.pair)
		if err != nil {
			return fmt.Errorf("a qrpc server: %w", err)
		}
		defer srv.stop()
		addrs, pids = append(addrs, srv.addr), append(pids, srv.pid)
	}
	return balanceSlow(e, p, t, addrs, pids[0])
}

// balanceRun is one answer of GET /bench/balance.
type balanceRun struct {
	Calls   int            `json:"calls"`
	Errors  int            `json:"errors"`
	P50     float64        `json:"p50"`
	P99     float64        `json:"p99"`
	Servers map[string]int `json:"servers"`
}

// balanceSlow runs each balancer over the three server processes while
// the first one is paused 100 ms in every 300 ms, the balancers in turn
// within each round so that the machine's drift weighs on all alike: the
// slow server's share of the calls and the calls' p99, p2c against
// round_robin and least_inflight.
func balanceSlow(e *env, p params, t *table, addrs []string, slowPID int) error {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = syscall.Kill(slowPID, syscall.SIGSTOP)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-stop:
			}
			_ = syscall.Kill(slowPID, syscall.SIGCONT)
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	defer func() { close(stop); <-done }()
	bals := []string{"p2c", "round_robin", "least_inflight"}
	got := map[string][]balanceRun{}
	// Each run spans many pause cycles (about 25,000 calls/s here: 30,000
	// calls last some 4 cycles of 300 ms), or the figures would depend on
	// where in a cycle a run falls.
	calls := max(6*p.poolParN, 30000)
	for range max(p.runs, 3) {
		for _, b := range bals {
			body, err := e.nginx.get(fmt.Sprintf("/bench/balance?addrs=%s&balance=%s&n=%d&c=%d",
				strings.Join(addrs, ","), b, calls, p.conc))
			if err != nil {
				return fmt.Errorf("balance %s: %w", b, err)
			}
			var r balanceRun
			if err := json.Unmarshal([]byte(body), &r); err != nil {
				return fmt.Errorf("bad /bench/balance answer %q: %w", body, err)
			}
			log.Printf("balance %s, one server paused: %d calls, %d errors, p50 %.2f ms, p99 %.2f ms, slow server %d",
				b, r.Calls, r.Errors, r.P50, r.P99, r.Servers[addrs[0]])
			got[b] = append(got[b], r)
		}
	}
	share := func(r balanceRun) float64 {
		all := 0
		for _, n := range r.Servers {
			all += n
		}
		return 100 * float64(r.Servers[addrs[0]]) / float64(max(all, 1))
	}
	p99 := func(r balanceRun) float64 { return r.P99 }
	errs := func(r balanceRun) float64 { return float64(r.Errors) }
	pc := got["p2c"]
	for _, b := range bals[1:] {
		o := got[b]
		t.add(row{section: secBalanceSlow, name: fmt.Sprintf("%d calls from %d light threads × %d runs: p99, p2c vs %s", calls, p.conc, len(pc), b),
			subject: fmtMS(medianBy(pc, p99)), baseline: fmtMS(medianBy(o, p99)), ratio: medianBy(pc, p99) / medianBy(o, p99), ratioLabel: "p99 ratio"})
		t.add(row{section: secBalanceSlow, name: fmt.Sprintf("the paused server's share of the calls, p2c vs %s (errors %.0f vs %.0f)", b, medianBy(pc, errs), medianBy(o, errs)),
			subject: fmt.Sprintf("%.1f %%", medianBy(pc, share)), baseline: fmt.Sprintf("%.1f %%", medianBy(o, share)),
			ratio: medianBy(pc, share) / max(medianBy(o, share), 0.01), ratioLabel: "share ratio"})
	}
	return nil
}
