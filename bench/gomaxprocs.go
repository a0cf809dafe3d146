package main

// GOMAXPROCS of the nginx workers: each worker has its own Go runtime, so
// with N workers on N CPUs Go's default gives N runtimes of N Ps each.
// This section measures, unpinned, with 1 and 2 workers, GOMAXPROCS 1 and
// 2 against the library's default (no GOMAXPROCS in the environment: 1 P
// with the built-in host since that table chose it, so GOMAXPROCS=1 is an
// A/A control and GOMAXPROCS=2 is Go's own default on 2 CPUs): the worker
// CPU per request and requests/s under wrk, and the time of a sequential
// call.

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"time"
)

// goDefaultProcs is what Go's default GOMAXPROCS is for an unpinned
// process here (the CPUs this harness may run on, within its cgroup's
// limit).
// lazySysmon keeps Go's sysmon thread from its deep sleep, so that system
// calls and cgo calls do not wake it into 20 us polling (README, Tuning).
const lazySysmon = "schedtrace=2147483647"

func goDefaultProcs() int {
	if os.Getenv("GOMAXPROCS") == "" {
		return runtime.GOMAXPROCS(0)
	}
	return runtime.NumCPU()
}

// gmpSample is one run of one setting.
type gmpSample struct {
	wrk wrkResult
	seq time.Duration
}

func measureGOMAXPROCS(e *env, p params, pl placement) (gmpSample, error) {
	if err := e.apply(pl); err != nil {
		return gmpSample{}, err
	}
	workers, err := e.nginx.workers()
	if err != nil {
		return gmpSample{}, err
	}
	log.Printf("gomaxprocs: %s", pl.name)
	// The sequential loop warms up (and times) one worker; the requests
	// after it load the library and dial in the others, before wrk.
	d, err := e.nginx.lua("unary", p.gmpSeqN, 100, 1)
	if err != nil {
		return gmpSample{}, err
	}
	if err := e.nginx.warm("/e2e/qrpc", 10*len(workers)); err != nil {
		return gmpSample{}, err
	}
	w, err := wrk(e.nginx.port, "/e2e/qrpc", p.gmpWrkDur, workers)
	if err != nil {
		return gmpSample{}, err
	}
	if w.non2xx > 0 {
		return gmpSample{}, fmt.Errorf("%s: %d non-2xx answers; error.log:\n%s", pl.name, w.non2xx, tail(filepath.Join(e.nginx.dir, "error.log")))
	}
	return gmpSample{wrk: w, seq: d}, nil
}

func figureGOMAXPROCS(e *env, p params, t *table) error {
	defer e.restore(p)
	if !haveWrk(t) {
		return nil
	}
	var settings []placement
	for _, workers := range []int{1, 2} {
		wn := fmt.Sprintf("%d worker", workers)
		if workers > 1 {
			wn += "s"
		}
		for _, g := range []string{"", "1", "2"} {
			name := wn + ", the library's default"
			if g != "" {
				name = fmt.Sprintf("%s, GOMAXPROCS=%s", wn, g)
			}
			settings = append(settings, placement{name: name, gomaxprocs: g, workers: workers})
		}
		if workers == 1 {
			// The README's sysmon setting (Tuning), against the default
			// with the same worker (rows compare with the last default).
			settings = append(settings, placement{name: "1 worker, " + lazySysmon, godebug: lazySysmon, workers: 1})
		}
	}
	// Runs interleave the settings (one nginx restart each) so that a
	// slow spell on this shared machine does not land on one setting.
	samples := make([][]gmpSample, len(settings))
	for i := 0; i < p.runs; i++ {
		for j, pl := range settings {
			s, err := measureGOMAXPROCS(e, p, pl)
			if err != nil {
				return err
			}
			samples[j] = append(samples[j], s)
		}
	}
	sec := fmt.Sprintf("GOMAXPROCS of the nginx workers (unpinned; baseline: the library's default, 1 P, with the same workers, so GOMAXPROCS=1 is an A/A control; Go's own default is %d here; wrk -t2 -c50)", goDefaultProcs())
	cpu := func(s gmpSample) float64 { return cpuUS(0)(s.wrk) }
	reqs := func(s gmpSample) float64 { return s.wrk.rps }
	seq := func(s gmpSample) float64 { return s.seq.Seconds() * 1e6 / float64(p.gmpSeqN) }
	p99 := func(s gmpSample) float64 { return p99ms(s.wrk) }
	var def []gmpSample
	for j, pl := range settings {
		if pl.gomaxprocs == "" && pl.godebug == "" {
			def = samples[j]
			continue
		}
		r := samples[j]
		if pl.godebug != "" {
			t.add(row{section: sec, name: pl.name + ": HTTP p99 latency", subject: fmtMS(medianBy(r, p99)),
				baseline: fmtMS(medianBy(def, p99)), ratio: medianBy(r, p99) / medianBy(def, p99), ratioLabel: "latency ratio"})
		}
		t.add(cpuRow(sec, pl.name+": CPU per request, nginx workers (all their threads)", medianBy(r, cpu), medianBy(def, cpu)))
		t.add(row{section: sec, name: pl.name + ": HTTP requests/s", subject: fmt.Sprintf("%.0f req/s", medianBy(r, reqs)),
			baseline: fmt.Sprintf("%.0f req/s", medianBy(def, reqs)), ratio: medianBy(r, reqs) / medianBy(def, reqs), ratioLabel: "throughput ratio"})
		t.add(row{section: sec, name: fmt.Sprintf("%s: sequential unary call, 100 B (median of %d-call runs)", pl.name, p.gmpSeqN),
			subject: fmtUS(medianBy(r, seq)), baseline: fmtUS(medianBy(def, seq)), ratio: medianBy(r, seq) / medianBy(def, seq), ratioLabel: "time ratio"})
	}
	return nil
}
