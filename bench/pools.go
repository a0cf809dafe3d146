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

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
)

const (
	secPools     = "Pools: a pool of 3 servers vs 1 server, same server process (3 listeners vs 1 of them)"
	secPoolsProc = "Pools: 3 server processes vs 1 server process (same machine; for information)"
	secPoolsConn = "Pools: a pool of 3 servers vs 1 server over 3 QUIC connections (conns = 3), same server process: what the pool itself costs"
	poolTarget   = "≥ 0.95"
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
func (n *nginx) poolRun(three, one []string, oneConns int, pids []int, calls, c, block int) (poolRun, error) {
	var r poolRun
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	body, err := n.get(fmt.Sprintf("/bench/pools?a=%s&b=%s&bconns=%d&pids=%s&n=%d&c=%d&block=%d&size=100",
		strings.Join(three, ","), strings.Join(one, ","), oneConns, strings.Join(ps, ","), calls, c, block))
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
	}{
		{secPools, multiAddrs, multiAddrs[:1], 1, []int{multi.pid}, poolTarget, true},
		{secPoolsConn, multiAddrs, multiAddrs[:1], 3, []int{multi.pid}, "", false},
		{secPoolsProc, procAddrs, procAddrs[:1], 1, procPIDs, "", true},
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
				pr, err := e.nginx.poolRun(s.three, s.one, s.oneConns, s.pids, r.calls, r.c, r.block)
				if err != nil {
					return fmt.Errorf("%s: %w", r.name, err)
				}
				log.Printf("pools: %s, %s: 3 servers %.0f calls/s, 1 server %.0f calls/s (%.3f); CPU per call: worker %.1f vs %.1f µs, servers %.1f vs %.1f µs",
					s.sec[:24], r.name, pr.aRate(), pr.bRate(), pr.rateRatio(), pr.aCPU(), pr.bCPU(), pr.aSrv(), pr.bSrv())
				got = append(got, pr)
			}
			tr := row{section: s.sec, name: fmt.Sprintf("%s × %d runs: throughput (runs' ratios %s)", r.name, runs, ratioSpread(got, poolRun.rateRatio)),
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
				cr := cpuRow(s.sec, fmt.Sprintf("%s: %s (runs' ratios %s)", r.name, c.what, ratioSpread(got, c.rat)), medianBy(got, c.a), medianBy(got, c.b))
				cr.ratio = medianBy(got, c.rat)
				t.add(cr)
			}
		}
	}
	return nil
}
