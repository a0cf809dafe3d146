package main

// The stream subsystem: with an nginx that has ngx_stream_lua (the
// openresty flavour, -stream-nginx), one worker runs the same Lua
// (bench/lua/bench_stream.lua) in an http {} server and a stream {}
// server, against the qrpc server the unary rows call. Sequential calls
// from a stream {} handler are measured against the same calls from an
// http {} location; then 50 clients load http alone, stream alone and
// both at once.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

const (
	secStreamUnary = "Stream subsystem: sequential unary calls from a stream {} server vs an http {} location (OpenResty-equivalent nginx, 1 worker)"
	secStreamLoad  = "Stream subsystem: 50 clients on each subsystem, one call per line or request: both at once vs one alone (1 worker)"

	streamSize  = 100 // body bytes, as the unary rows' first size
	streamConns = 50  // TCP clients of the stream server, as wrk -c50 on http
)

// streamNginx is the binary the section runs, probed, or why it cannot:
// bin "" means the openresty flavour's build in QRPC_BUILD_DIR.
func streamNginx(bin string) (*ngxtest.Nginx, string) {
	if bin == "" {
		dir, err := ngxtest.BuildDir()
		if err != nil {
			return nil, err.Error()
		}
		bin = filepath.Join(dir, ngxtest.OpenResty, "sbin", "nginx")
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Sprintf("no nginx with ngx_stream_lua: %s is not built (make nginx-openresty builds it; %s=%s), or give one with -stream-nginx PATH",
				bin, ngxtest.EnvBuildDir, dir)
		}
	} else if _, err := exec.LookPath(bin); err != nil {
		return nil, fmt.Sprintf("-stream-nginx %s: %v", bin, err)
	}
	ng, err := ngxtest.Probe(bin)
	if err != nil {
		return nil, err.Error()
	}
	if !ng.StreamLua {
		return nil, ng.NoStreamLua
	}
	if ng.RestyFFILib != "" {
		// The http {} VM would take the resty_ffi host: the rows compare
		// the subsystems on the built-in host.
		return nil, bin + " is a build for lua-resty-ffi"
	}
	return ng, ""
}

// startStreamNginx starts the section's nginx in e.dir/stream; the caller
// stops it.
func (e *env) startStreamNginx(ng *ngxtest.Nginx, o nginxOpts) (*nginx, int, error) {
	tmpl, err := template.ParseFiles(filepath.Join(e.root, "bench", "stream.conf.tmpl"))
	if err != nil {
		return nil, 0, err
	}
	dir := filepath.Join(e.dir, "stream")
	n, err := e.newNginx(ng.Bin, dir, "builtin", "")
	if err != nil {
		return nil, 0, err
	}
	port, err := freePort()
	if err != nil {
		return nil, 0, err
	}
	n.tmpl = tmpl
	n.data["Main"] = ng.MainConf()
	n.data["LuaPath"] = ng.PackagePath(dir+"/?.lua", filepath.Join(e.root, "bench", "lua", "?.lua"), filepath.Join(e.root, "lua", "?.lua"))
	n.data["StreamPort"] = port
	n.env = ng.Environ([]string{})
	o.workers = 1
	if err := n.start(o); err != nil {
		n.stop() // it may have started without answering
		return nil, 0, err
	}
	return n, port, nil
}

func figureStream(e *env, p params, t *table) error {
	ng, why := streamNginx(p.streamNginx)
	if why != "" {
		t.note("Stream subsystem skipped: %s.", why)
		log.Printf("stream: skipped: %s", why)
		return nil
	}
	n, port, err := e.startStreamNginx(ng, p.main)
	if err != nil {
		return err
	}
	defer n.stop()
	// Each VM's own subsystem, as the library reports it: a figure under a
	// wrong label would be worse than none.
	got, err := n.get("/subsystem")
	if err != nil {
		return err
	}
	if got != "http" {
		return fmt.Errorf("the http location runs in subsystem %q", got)
	}
	if got, err := askLine(port, "subsystem", 30*time.Second); err != nil || got != "stream" {
		return fmt.Errorf("the stream server runs in subsystem %q (%v)", got, err)
	}
	t.note("Stream subsystem: both sides run in one worker of %s, the http {} side as the baseline; each subsystem's Lua VM has its own completion queue, wake-up socket, dispatcher and QUIC connection to the same server.", ng.Version)
	if err := streamUnaryRows(n, port, p, t); err != nil {
		return err
	}
	if _, err := exec.LookPath("wrk"); err != nil {
		t.note("Stream subsystem under load skipped: wrk not installed (apt-get install wrk).")
		return nil
	}
	return streamLoadRows(n, port, p, t)
}

// streamUnaryRows: the same sequential calls, each loop run inside the
// worker by one stream {} handler or one http {} request, alternately.
func streamUnaryRows(n *nginx, port int, p params, t *table) error {
	calls := p.streamSeqN
	log.Printf("stream: %d sequential calls of %s, stream vs http, %d runs", calls, sizeName(streamSize), p.streamSeqRuns)
	// Many short runs in turn rather than a few long ones: on a shared
	// machine the load of the others then weighs on both sides alike.
	ss, hs, err := alternate(p.streamSeqRuns,
		func() (callStats, error) {
			line, err := askLine(port, fmt.Sprintf("loop %d %d", calls, streamSize), 10*time.Minute)
			if err != nil {
				return callStats{}, fmt.Errorf("stream loop: %w", err)
			}
			return n.parseStats("stream loop", line)
		},
		func() (callStats, error) {
			body, err := n.get(fmt.Sprintf("/loop?n=%d&size=%d", calls, streamSize))
			if err != nil {
				return callStats{}, err
			}
			return n.parseStats("http loop", body)
		})
	if err != nil {
		return err
	}
	name := fmt.Sprintf("%s, %d sequential calls × %d runs: stream {} vs http {}", sizeName(streamSize), calls, p.streamSeqRuns)
	t.add(rateRow(secStreamUnary, fmt.Sprintf("%s: calls/s (runs' ratios %s)", name, spread(pairRatios(hs, ss, statSecs))),
		calls, secs(medianBy(ss, statSecs)), secs(medianBy(hs, statSecs))))
	c := float64(calls)
	t.add(cpuRow(secStreamUnary, fmt.Sprintf("%s: worker CPU per call, all its threads (runs' ratios %s)", name, spread(pairRatios(ss, hs, statCPUSecs))),
		medianBy(ss, statCPUSecs)*1e6/c, medianBy(hs, statCPUSecs)*1e6/c))
	t.add(cswRow(secStreamUnary, name+": context switches per call, worker", medianBy(ss, statCSW)/c, medianBy(hs, statCSW)/c))
	return nil
}

// pairRatios is f(a[i]) / f(b[i]) for each run i.
func pairRatios(a, b []callStats, f func(callStats) float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = f(a[i]) / f(b[i])
	}
	return out
}

// spread is "lo–hi" of a figure's per-run ratios.
func spread(v []float64) string {
	if len(v) == 0 {
		return "none"
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return fmt.Sprintf("%.2f–%.2f", s[0], s[len(s)-1])
}

// alternate is pairStats with the order of the two turned every other
// run, so that neither side always runs right after the other.
func alternate(runs int, a, b func() (callStats, error)) ([]callStats, []callStats, error) {
	var as, bs []callStats
	for i := 0; i < runs; i++ {
		first, second := a, b
		if i%2 == 1 {
			first, second = b, a
		}
		x, err := first()
		if err != nil {
			return nil, nil, err
		}
		y, err := second()
		if err != nil {
			return nil, nil, err
		}
		if i%2 == 1 {
			x, y = y, x
		}
		as, bs = append(as, x), append(bs, y)
	}
	return as, bs, nil
}

// loadCost is what one load cost the worker: calls answered, CPU time
// of all its threads and of its nginx thread, context switches.
type loadCost struct {
	calls     int
	cpu, main time.Duration
	csw       int64
}

func usPer(d time.Duration, calls int) float64 {
	if calls == 0 {
		return 0
	}
	return d.Seconds() * 1e6 / float64(calls)
}

func (c loadCost) cpuUS() float64   { return usPer(c.cpu, c.calls) }
func (c loadCost) mainUS() float64  { return usPer(c.main, c.calls) }
func (c loadCost) otherUS() float64 { return usPer(c.cpu-c.main, c.calls) }
func (c loadCost) cswPer() float64 {
	if c.calls == 0 {
		return 0
	}
	return float64(c.csw) / float64(c.calls)
}

// loadRound is one round of the load rows: each subsystem alone, and
// both at once.
type loadRound struct {
	http, stream         wrkResult // alone
	bothHTTP, bothStream wrkResult // at once
	httpCost, streamCost loadCost  // alone
	bothCost             loadCost  // at once, both kinds of calls
}

// aloneForMix is what the calls of the both-at-once run would cost at
// each subsystem's cost alone (f per call), per call: the baseline of
// f(r.bothCost).
func (r loadRound) aloneForMix(f func(loadCost) float64) float64 {
	return mixCPU(r.bothHTTP.reqs, r.bothStream.reqs, f(r.httpCost), f(r.streamCost))
}

// mixCPU is the mean cost per call (CPU, or context switches) of h calls
// at hUS each and s calls at sUS each.
func mixCPU(h, s int, hUS, sUS float64) float64 {
	if h+s == 0 {
		return 0
	}
	return (float64(h)*hUS + float64(s)*sUS) / float64(h+s)
}

// costOf runs load and measures what it costs worker pid.
func costOf(pid int, load func() (calls int, err error)) (loadCost, error) {
	cpu0, err := procCPU(pid)
	if err != nil {
		return loadCost{}, err
	}
	main0, err := threadCPU(pid, pid)
	if err != nil {
		return loadCost{}, err
	}
	csw0, err := procCSW(pid)
	if err != nil {
		return loadCost{}, err
	}
	calls, err := load()
	if err != nil {
		return loadCost{}, err
	}
	cpu1, err1 := procCPU(pid)
	main1, err2 := threadCPU(pid, pid)
	csw1, err3 := procCSW(pid)
	if err := errors.Join(err1, err2, err3); err != nil {
		return loadCost{}, err
	}
	return loadCost{calls: calls, cpu: cpu1 - cpu0, main: main1 - main0, csw: csw1 - csw0}, nil
}

// streamRound runs the three loads in the given order of kinds (0 http
// alone, 1 stream alone, 2 both at once).
func streamRound(n *nginx, port int, dur time.Duration, pid int, order []int) (loadRound, error) {
	var r loadRound
	path := fmt.Sprintf("/call?size=%d", streamSize)
	line := fmt.Sprintf("call %d", streamSize)
	httpLoad := func(into *wrkResult) func() (int, error) {
		return func() (int, error) {
			w, err := wrk(n.port, path, durArg(dur))
			if err == nil && w.non2xx > 0 {
				err = fmt.Errorf("http: %d non-2xx answers", w.non2xx)
			}
			*into = w
			return w.reqs, err
		}
	}
	streamLoad := func(into *wrkResult) func() (int, error) {
		return func() (int, error) {
			l, err := lineLoad(port, streamConns, dur, line)
			*into = l
			return l.reqs, err
		}
	}
	for _, k := range order {
		var err error
		switch k {
		case 0:
			r.httpCost, err = costOf(pid, httpLoad(&r.http))
		case 1:
			r.streamCost, err = costOf(pid, streamLoad(&r.stream))
		case 2:
			r.bothCost, err = costOf(pid, func() (int, error) {
				var hn, sn int
				var herr, serr error
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); hn, herr = httpLoad(&r.bothHTTP)() }()
				go func() { defer wg.Done(); sn, serr = streamLoad(&r.bothStream)() }()
				wg.Wait()
				return hn + sn, errors.Join(herr, serr)
			})
		}
		if err != nil {
			return r, fmt.Errorf("load %s: %w; error.log:\n%s", []string{"http alone", "stream alone", "both at once"}[k], err, tail(filepath.Join(n.dir, "error.log")))
		}
	}
	return r, nil
}

func streamLoadRows(n *nginx, port int, p params, t *table) error {
	worker, err := n.workers()
	if err != nil {
		return err
	}
	dur, err := time.ParseDuration(p.streamDur)
	if err != nil {
		return fmt.Errorf("stream load duration: %w", err)
	}
	// warm both VMs (connections, JIT traces) before anything is timed
	if _, err := lineLoad(port, streamConns, 300*time.Millisecond, fmt.Sprintf("call %d", streamSize)); err != nil {
		return fmt.Errorf("stream warm-up: %w", err)
	}
	if err := n.warm(fmt.Sprintf("/call?size=%d", streamSize), streamConns); err != nil {
		return fmt.Errorf("http warm-up: %w", err)
	}
	// the order turns each round, so that no load always follows another
	orders := [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}}
	var rounds []loadRound
	for i := 0; i < p.streamRounds; i++ {
		log.Printf("stream: load round %d: http alone, stream alone, both at once (%s each)", i+1, dur)
		r, err := streamRound(n, port, dur, worker[0], orders[i%len(orders)])
		if err != nil {
			return err
		}
		rounds = append(rounds, r)
	}
	addStreamLoadRows(t, rounds)
	return nil
}

// addStreamLoadRows adds the medians of the load rounds.
func addStreamLoadRows(t *table, rounds []loadRound) {
	med := func(f func(loadRound) float64) float64 { return medianBy(rounds, f) }
	hb, ha := med(func(r loadRound) float64 { return r.bothHTTP.rps }), med(func(r loadRound) float64 { return r.http.rps })
	t.add(row{section: secStreamLoad, name: "http requests/s (wrk -t2 -c50): both subsystems loaded at once vs http alone",
		subject: fmt.Sprintf("%.0f req/s", hb), baseline: fmt.Sprintf("%.0f req/s", ha), ratio: hb / ha, ratioLabel: "throughput ratio"})
	sb, sa := med(func(r loadRound) float64 { return r.bothStream.rps }), med(func(r loadRound) float64 { return r.stream.rps })
	t.add(row{section: secStreamLoad, name: fmt.Sprintf("stream lines/s (%d TCP connections): both subsystems loaded at once vs stream alone", streamConns),
		subject: fmt.Sprintf("%.0f lines/s", sb), baseline: fmt.Sprintf("%.0f lines/s", sa), ratio: sb / sa, ratioLabel: "throughput ratio"})
	// at once against each kind's calls at their cost alone
	for _, c := range []struct {
		what string
		f    func(loadCost) float64
	}{
		{"worker CPU per call, all its threads", loadCost.cpuUS},
		{"of which the nginx thread", loadCost.mainUS},
		{"of which the other threads (Go's)", loadCost.otherUS},
	} {
		ratios := values(rounds, func(r loadRound) float64 { return c.f(r.bothCost) / r.aloneForMix(c.f) })
		t.add(cpuRow(secStreamLoad, fmt.Sprintf("%s: both at once vs each alone, weighted by the calls of each kind at once (rounds' ratios %s)", c.what, spread(ratios)),
			med(func(r loadRound) float64 { return c.f(r.bothCost) }), med(func(r loadRound) float64 { return r.aloneForMix(c.f) })))
	}
	t.add(cswRow(secStreamLoad, "context switches per call, worker: both at once vs each alone, weighted the same way",
		med(func(r loadRound) float64 { return r.bothCost.cswPer() }), med(func(r loadRound) float64 { return r.aloneForMix(loadCost.cswPer) })))
	t.add(cpuRow(secStreamLoad, fmt.Sprintf("worker CPU per call, alone: a stream line vs an http request (rounds' ratios %s)",
		spread(values(rounds, func(r loadRound) float64 { return r.streamCost.cpuUS() / r.httpCost.cpuUS() }))),
		med(func(r loadRound) float64 { return r.streamCost.cpuUS() }), med(func(r loadRound) float64 { return r.httpCost.cpuUS() })))
	s99, h99 := med(func(r loadRound) float64 { return p99ms(r.stream) }), med(func(r loadRound) float64 { return p99ms(r.http) })
	t.add(row{section: secStreamLoad, name: "p99 latency, alone: a stream line vs an http request", subject: fmtMS(s99), baseline: fmtMS(h99),
		ratio: s99 / h99, ratioLabel: "latency ratio"})
}

// durArg is d as wrk's -d argument (whole seconds: wrk takes no ms).
func durArg(d time.Duration) string {
	return fmt.Sprintf("%ds", max(int(d.Round(time.Second).Seconds()), 1))
}

// ---- the stream server's TCP clients ----

// askLine sends one line on a connection of its own and reads the answer
// line; an "ERR ..." answer is an error.
func askLine(port int, line string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	s, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("%q: %w", line, err)
	}
	return checkAnswer(s)
}

// checkAnswer strips an answer line's newline; "ERR ..." is an error.
func checkAnswer(s string) (string, error) {
	s = strings.TrimSuffix(s, "\n")
	if strings.HasPrefix(s, "ERR") {
		return "", fmt.Errorf("stream server: %s", s)
	}
	return s, nil
}

// lineLoad is wrk's shape on the stream server: conns connections, each
// sending line and waiting for its answer line in turn for dur. Any
// "ERR" answer or broken connection fails the load.
func lineLoad(port, conns int, dur time.Duration, line string) (wrkResult, error) {
	cs := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for i := 0; i < conns; i++ {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			return wrkResult{}, fmt.Errorf("line load: %w", err)
		}
		cs = append(cs, c)
	}
	lats := make([][]time.Duration, conns)
	errs := make([]error, conns)
	msg := []byte(line + "\n")
	start := time.Now()
	end := start.Add(dur)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lats[i], errs[i] = lineClient(c, msg, end)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return wrkResult{}, fmt.Errorf("line load: %w", err)
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	return lineResult(all, elapsed), nil
}

// lineClient asks msg on c until end (bounded by it: each answer has 10 s
// at most) and returns each answer's latency.
func lineClient(c net.Conn, msg []byte, end time.Time) ([]time.Duration, error) {
	r := bufio.NewReader(c)
	var lats []time.Duration
	for t0 := time.Now(); t0.Before(end); t0 = time.Now() {
		_ = c.SetDeadline(t0.Add(10 * time.Second))
		if _, err := c.Write(msg); err != nil {
			return lats, err
		}
		s, err := r.ReadString('\n')
		if err != nil {
			return lats, err
		}
		if _, err := checkAnswer(s); err != nil {
			return lats, err
		}
		lats = append(lats, time.Since(t0))
	}
	return lats, nil
}

// lineResult is a line load's latencies over elapsed as wrk's figures.
func lineResult(lats []time.Duration, elapsed time.Duration) wrkResult {
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r := wrkResult{reqs: len(lats), p50: percentile(lats, 0.50), p99: percentile(lats, 0.99)}
	if elapsed > 0 {
		r.rps = float64(len(lats)) / elapsed.Seconds()
	}
	return r
}

// percentile is the q-quantile (0..1) of sorted latencies, nearest rank;
// 0 for none.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(sorted))*q)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
