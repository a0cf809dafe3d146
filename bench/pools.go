package main

// Pools (issue 9): the same unary calls from Lua through a pool of three
// qrpc servers and through a pool of one, all on this machine. What the
// pool adds per call (picking a server, counting calls in flight) must
// not cost throughput; the three servers share the machine's CPUs with
// everything else, so they are not three times the capacity.

import (
	"fmt"
	"log"
	"strings"
	"time"
)

func figurePools(e *env, p params, t *table) error {
	const sec = "Pools: 3 servers vs 1 server (same machine)"
	addrs := []string{e.qrpcAddr}
	for range 2 {
		srv, err := startServerProcess(e.dir, e.pair)
		if err != nil {
			return fmt.Errorf("another qrpc server: %w", err)
		}
		defer srv.stop()
		addrs = append(addrs, srv.addr)
	}
	rows := []struct {
		name     string
		calls, c int
	}{
		{fmt.Sprintf("100 B, %d sequential calls", p.poolSeqN), p.poolSeqN, 1},
		{fmt.Sprintf("100 B, %d calls from %d light threads", p.poolParN, p.conc), p.poolParN, p.conc},
	}
	for _, r := range rows {
		log.Printf("pools: %s", r.name)
		var cpu3, cpu1 []float64
		three, one, err := pair(p.runs,
			e.poolMeasure(addrs, r.calls, r.c, &cpu3),
			e.poolMeasure(addrs[:1], r.calls, r.c, &cpu1))
		if err != nil {
			return err
		}
		t.add(rateRow(sec, r.name+": throughput", r.calls, three, one).withTarget("≥ 0.95"))
		id := func(v float64) float64 { return v }
		t.add(cpuRow(sec, r.name+": CPU per call, nginx worker (all its threads)", medianBy(cpu3, id), medianBy(cpu1, id)))
	}
	return nil
}

// poolMeasure is one run of calls through a pool of addrs, as a figure for
// pair; each run appends the worker's CPU time per call (µs) to cpu.
func (e *env) poolMeasure(addrs []string, calls, c int, cpu *[]float64) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		pids, err := e.nginx.workers()
		if err != nil {
			return 0, err
		}
		before, err := procCPU(pids...)
		if err != nil {
			return 0, err
		}
		d, err := e.nginx.luaQuery("pool", fmt.Sprintf("kind=pool&n=%d&size=100&c=%d&addrs=%s", calls, c, strings.Join(addrs, ",")))
		if err != nil {
			return 0, err
		}
		after, err := procCPU(pids...)
		if err != nil {
			return 0, err
		}
		// bench.lua warms up with min(calls/10+1, 2000) calls first: they
		// ran on the worker's CPU too.
		all := calls + min(calls/10+1, 2000)
		*cpu = append(*cpu, float64((after-before).Microseconds())/float64(all))
		return d, nil
	}
}
