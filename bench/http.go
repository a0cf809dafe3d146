package main

// HTTP end to end (wrk -t2 -c50): one qrpc unary call per HTTP request in
// the nginx worker, against proxy_pass to a Go HTTP/1.1 upstream, and
// against the sidecar a user of stock nginx would deploy instead (nginx
// proxy_pass keepalive → Go HTTP/1.1 service → the same qrpc server).
// All three are measured in the same rounds, alternately.

import (
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
)

const (
	secHTTP    = "HTTP end to end (wrk -t2 -c50, 1 worker)"
	secSidecar = "Sidecar baseline: in-process vs nginx → Go HTTP/1.1 sidecar → qrpc (wrk -t2 -c50, 1 worker)"
)

func figureHTTP(e *env, p params, t *table) error {
	if !haveWrk(t) {
		return nil
	}
	return httpRows(e, p, t, secHTTP, "", true)
}

func haveWrk(t *table) bool {
	if _, err := exec.LookPath("wrk"); err != nil {
		t.note("HTTP end to end skipped: wrk not installed (apt-get install wrk).")
		return false
	}
	return true
}

// httpRows adds the wrk figures: those against proxy_pass to section sec,
// those against the sidecar to secSidecar; prefix starts each row's name.
// The targets (the sidecar rows, the worker's CPU against proxy_pass) hold
// for the default placement only (targets true).
func httpRows(e *env, p params, t *table, sec, prefix string, targets bool) error {
	worker, err := e.nginx.workers()
	if err != nil {
		return err
	}
	srv, harness, sidecar := []int{e.srvPID}, []int{os.Getpid()}, []int{e.sidecar.pid}
	var qs, ps, ss []wrkResult
	for i := 0; i < p.runs; i++ {
		log.Printf("http end to end, %srun %d", prefix, i+1)
		// CPU watched: the worker, then the upstream (the qrpc server
		// process; the HTTP upstream is served by this harness), then
		// for the sidecar path the qrpc server.
		q, err := wrk(e.nginx.port, "/e2e/qrpc", p.wrkDur, worker, srv)
		if err != nil {
			return err
		}
		pr, err := wrk(e.nginx.port, "/e2e/proxy", p.wrkDur, worker, harness)
		if err != nil {
			return err
		}
		sc, err := wrk(e.nginx.port, "/e2e/sidecar", p.wrkDur, worker, sidecar, srv)
		if err != nil {
			return err
		}
		if q.non2xx > 0 || pr.non2xx > 0 || sc.non2xx > 0 {
			return fmt.Errorf("non-2xx answers: qrpc %d, proxy %d, sidecar %d; error.log:\n%s", q.non2xx, pr.non2xx, sc.non2xx, tail(filepath.Join(e.dir, "error.log")))
		}
		qs, ps, ss = append(qs, q), append(ps, pr), append(ss, sc)
	}
	target := func(r row, want string) row {
		if targets {
			return r.withTarget(want)
		}
		return r
	}
	qr, pr := medianBy(qs, rps), medianBy(ps, rps)
	t.add(row{section: sec, name: prefix + "HTTP requests/s (wrk -t2 -c50): qrpc unary per request vs proxy_pass keepalive",
		subject: fmt.Sprintf("%.0f req/s", qr), baseline: fmt.Sprintf("%.0f req/s", pr), ratio: qr / pr, ratioLabel: "throughput ratio"}.withTarget("≥ 1.0"))
	q50, p50v := medianBy(qs, p50ms), medianBy(ps, p50ms)
	t.add(row{section: sec, name: prefix + "HTTP p50 latency", subject: fmtMS(q50), baseline: fmtMS(p50v),
		ratio: q50 / p50v, ratioLabel: "latency ratio"}.withTarget("≤ 1.0"))
	q99, p99v := medianBy(qs, p99ms), medianBy(ps, p99ms)
	t.add(row{section: sec, name: prefix + "HTTP p99 latency", subject: fmtMS(q99), baseline: fmtMS(p99v),
		ratio: q99 / p99v, ratioLabel: "latency ratio"}.withTarget("≤ 1.0"))
	// Why the throughput is what it is: on a machine where wrk, nginx and
	// the upstream share the CPUs, each request's CPU cost decides it.
	qw, pw := medianBy(qs, cpuUS(0)), medianBy(ps, cpuUS(0))
	t.add(target(cpuRow(sec, prefix+"CPU per request, nginx worker (all its threads, Go's included)", qw, pw), "≤ 1.3"))
	// Where the worker's extra CPU goes: each hand-off between the nginx
	// thread and a Go thread is a sleep and a wake-up.
	qc, pc := medianBy(qs, cswPer(0)), medianBy(ps, cswPer(0))
	t.add(cswRow(sec, prefix+"context switches per request, nginx worker (all its threads)", qc, pc))
	qu, pu := medianBy(qs, cpuUS(1)), medianBy(ps, cpuUS(1))
	t.add(cpuRow(sec, prefix+"CPU per request, upstream: qrpc server vs Go HTTP/1.1 server", qu, pu))

	sr := medianBy(ss, rps)
	t.add(target(row{section: secSidecar, name: prefix + "requests/s: in-process vs sidecar",
		subject: fmt.Sprintf("%.0f req/s", qr), baseline: fmt.Sprintf("%.0f req/s", sr), ratio: qr / sr, ratioLabel: "throughput ratio"}, "≥ 1.5"))
	s50 := medianBy(ss, p50ms)
	t.add(row{section: secSidecar, name: prefix + "p50 latency", subject: fmtMS(q50), baseline: fmtMS(s50),
		ratio: q50 / s50, ratioLabel: "latency ratio"})
	s99 := medianBy(ss, p99ms)
	t.add(target(row{section: secSidecar, name: prefix + "p99 latency", subject: fmtMS(q99), baseline: fmtMS(s99),
		ratio: q99 / s99, ratioLabel: "latency ratio"}, "≤ 0.7"))
	sw, sp, ssrv := medianBy(ss, cpuUS(0)), medianBy(ss, cpuUS(1)), medianBy(ss, cpuUS(2))
	t.add(cpuRow(secSidecar, prefix+"CPU per request, nginx worker", qw, sw))
	t.add(row{section: secSidecar, name: prefix + "CPU per request, sidecar process", subject: "—", baseline: fmtUS(sp), noRatio: true})
	t.add(cpuRow(secSidecar, prefix+"CPU per request, qrpc server", qu, ssrv))
	qAll := medianBy(qs, func(r wrkResult) float64 { return cpuUS(0)(r) + cpuUS(1)(r) })
	sAll := medianBy(ss, func(r wrkResult) float64 { return cpuUS(0)(r) + cpuUS(1)(r) + cpuUS(2)(r) })
	t.add(cpuRow(secSidecar, prefix+"CPU per request, all processes (worker + server vs worker + sidecar + server)", qAll, sAll))
	return nil
}

func cpuRow(sec, name string, subject, baseline float64) row {
	return row{section: sec, name: name, subject: fmtUS(subject), baseline: fmtUS(baseline), ratio: subject / baseline, ratioLabel: "CPU ratio"}
}

func cswRow(sec, name string, subject, baseline float64) row {
	return row{section: sec, name: name, subject: fmt.Sprintf("%.2f", subject), baseline: fmt.Sprintf("%.2f", baseline), ratio: subject / baseline, ratioLabel: "switch ratio"}
}

func fmtMS(ms float64) string { return fmt.Sprintf("%.2f ms", ms) }
func fmtUS(us float64) string { return fmt.Sprintf("%.1f µs", us) }
