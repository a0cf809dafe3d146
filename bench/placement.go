package main

// CPU placement: nginx restarted pinned to one CPU, with Go's default
// GOMAXPROCS and with GOMAXPROCS=2, against the Go client placed the same
// way, to back the README's advice. (GOMAXPROCS unpinned is gomaxprocs.go.)

import (
	"fmt"
	"log"
	"os"
	"os/exec"
	"runtime"
	"time"
)

// placement is where the client side runs: the nginx worker with the Go
// threads it starts, the sidecar, and the baseline Go client. When the
// client side is pinned to CPU 0, the servers (the qrpc server process and
// this harness, which serves the HTTP and unix-socket baselines) are
// pinned to the other CPUs, as a remote server would be.
type placement struct {
	name       string
	gomaxprocs string // GOMAXPROCS in the environment; "" leaves the default
	godebug    string // GODEBUG in the environment
	pin        bool   // client side on CPU 0, servers on the others
	workers    int    // nginx workers; 0 = 1
}

func (pl placement) nginxOpts() nginxOpts {
	o := nginxOpts{workers: pl.workers, gomaxprocs: pl.gomaxprocs, godebug: pl.godebug}
	if pl.pin {
		o.affinity = "01" // worker_cpu_affinity's bit mask for CPU 0
	}
	return o
}

var unpinned = placement{name: "unpinned, default GOMAXPROCS"}

// apply restarts nginx placed like pl and moves the servers and the
// sidecar.
func (e *env) apply(pl placement) error {
	e.nginx.stop()
	servers, client := allCPUs(), allCPUs()
	if pl.pin {
		servers, client = servers[1:], client[:1]
	}
	for _, pid := range []int{e.srvPID, os.Getpid()} {
		if err := setAffinity(pid, servers); err != nil {
			return err
		}
	}
	if e.sidecar != nil {
		if err := setAffinity(e.sidecar.pid, client); err != nil {
			return err
		}
	}
	return e.nginx.start(pl.nginxOpts())
}

// restore is the main figures' placement (-gomaxprocs, -affinity), with
// the servers and the sidecar unpinned.
func (e *env) restore(p params) {
	e.nginx.stop()
	for _, pid := range []int{e.srvPID, os.Getpid(), e.sidecar.pid} {
		if err := setAffinity(pid, allCPUs()); err != nil {
			log.Printf("restore placement: %v", err)
		}
	}
	if err := e.nginx.start(p.main); err != nil {
		log.Printf("restore placement: %v", err)
	}
}

// placementUsable says why CPU placement figures cannot run here, or "".
func placementUsable() string {
	if runtime.NumCPU() < 2 {
		return "one CPU"
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		return "taskset (util-linux) not installed"
	}
	return ""
}

// figurePlacement compares sequential unary calls with the Go client
// placed the same way; the pinned placements also get the concurrent and
// HTTP figures (the unpinned default has them above).
func figurePlacement(e *env, p params, t *table) error {
	defer e.restore(p)
	if why := placementUsable(); why != "" {
		t.note("CPU placement skipped: %s.", why)
		return nil
	}
	settings := []placement{
		{name: "pinned to CPU 0, default GOMAXPROCS (1)", pin: true},
		{name: "pinned to CPU 0, GOMAXPROCS=2", gomaxprocs: "2", pin: true},
	}
	const sec = "CPU placement (client side = nginx worker, sidecar or Go client; pinned: servers and wrk on the other CPUs)"
	for _, pl := range settings {
		if err := e.apply(pl); err != nil {
			return err
		}
		log.Printf("placement: %s", pl.name)
		ls, gs, err := pairStats(p.runs,
			e.nginx.stats("unary", p.placeN, 100, 1),
			e.goStats(pl, "seq", p.placeN, 100, 1))
		if err != nil {
			return err
		}
		l, g := secs(medianBy(ls, statSecs)), secs(medianBy(gs, statSecs))
		t.add(timeRow(sec, fmt.Sprintf("%s: 100 B, %d sequential calls: time", pl.name, p.placeN), l, g).withTarget("≤ 1.10"))
		// Pinned, the client side's CPU time is its share of each call's
		// time, and its context switches are most of that CPU's cost.
		n := float64(p.placeN)
		t.add(cpuRow(sec, fmt.Sprintf("%s: 100 B sequential calls: CPU per call, client side (the worker, all its threads, vs the Go client process)", pl.name),
			medianBy(ls, statCPUSecs)*1e6/n, medianBy(gs, statCPUSecs)*1e6/n))
		t.add(cswRow(sec, fmt.Sprintf("%s: 100 B sequential calls: context switches per call, client side", pl.name),
			medianBy(ls, statCSW)/n, medianBy(gs, statCSW)/n))
		// The same calls' floor for any design that hands each call from
		// the nginx thread to a Go thread and back (handoff.go): the Go
		// client's time plus one same-CPU round trip per call.
		var rtts []time.Duration
		for i := 0; i < p.runs; i++ {
			d, err := pingPong(p.placeN)
			if err != nil {
				return err
			}
			rtts = append(rtts, d)
		}
		rtt := median(rtts)
		t.add(timeRow(sec, fmt.Sprintf("%s: floor of a two-thread hand-off: the Go client's %d calls + %d same-CPU thread round trips (eventfd ping-pong: 2 context switches, 4 system calls)", pl.name, p.placeN, p.placeN), g+rtt, g))
		l, g, err = pair(p.runs,
			e.nginx.measure("unary", p.parN, 100, p.conc),
			e.goMeasure(pl, "par", p.parN, 100, p.conc))
		if err != nil {
			return err
		}
		t.add(rateRow(sec, fmt.Sprintf("%s: 100 B, %d light threads vs %d goroutines: throughput", pl.name, p.conc, p.conc), p.parN, l, g).withTarget("≥ 0.9"))
		if _, err := exec.LookPath("wrk"); err == nil {
			if err := httpRows(e, p, t, sec, pl.name+": ", false); err != nil {
				return err
			}
		}
	}
	return nil
}
