package main

// Idle cost: what an nginx worker that made one call and then sits idle
// costs, against plain workers of the same nginx in the same run, in the
// kernel's own accounting: PSS (each shared page divided among the
// processes that map it, what smem and systemd report), private memory
// (USS: Private_Clean + Private_Dirty, what the worker alone holds) and
// wake-ups (each thread's context switches), from /proc. RSS only for
// reference: it counts the library's pages, one copy in the page cache,
// in full in every worker that maps them.
//
// One nginx with 12 workers: 8 connect and make one call (each counted in
// a shared dict by its pid, so that the bench knows all 8 did), the other
// 4 only configure the module. Two windows per worker, cut around its own
// call: the transition (everything the call sets off once: its last
// packets, the trimmer giving back the call's blocks and stopping, and the
// connection's first keep-alive, which a user pays once per quiet spell,
// Go's sysmon with it: docs/tuning.md) and the steady idle window after it
// (the keep-alives every 15 s). A second nginx holds a shared pool with
// checks and re-resolution: one worker takes the leases, another follows,
// a third runs the same pool unshared, a fourth the same pool unshared
// without checks or re-resolution, the fifth is plain. -idle-libs
// runs the first nginx again beside it for each other build of the
// library, so that builds compare in one run.

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
)

var (
	idleLibs = flag.String("idle-libs", "", "idle figure: also measure these builds of the library, name=path,..., each in an nginx of its own beside the main one")
	// A burst leaves blocks in the caches the trimmer gives back.
	idleBurst = flag.Int("idle-burst", 0, "idle figure: after its call, each calling worker makes this many concurrent 64 KB echoes")
)

const (
	idleWorkers = 12
	idleCalling = 8
	// The shared pool's options: what a deployment with active checks
	// and DNS re-resolution sets.
	idleCheckMS   = 2000
	idleResolveMS = 30000
	poolName      = "bench-pool.test"
)

// idleRun is one nginx of the figure and what its workers did.
type idleRun struct {
	name  string // "" for the main build
	n     *nginx
	pids  []int
	ends  map[int]time.Time // each worker's call (or connect), when it was done
	roles map[int]string    // "call", "shared", "unshared", "quiet"
	// counted: the workers whose call the shared dict counted
	counted int
}

func figureIdle(e *env, p params, t *table) error {
	// The transition ends after the connection's first keep-alive, sent
	// 15 s (half the default 30 s idle timeout) after the call's last
	// packet, and its ACK; the window spans four keep-alive periods (two
	// when quick).
	settle, window := 20*time.Second, 60*time.Second
	if p.quick {
		window = 30 * time.Second
	}
	dns, err := dnstest.Listen(poolName + ".")
	if err != nil {
		return err
	}
	defer dns.Close()
	dns.Set("127.0.0.1")
	libs := []struct{ name, path string }{{"", e.lib}}
	for _, kv := range strings.Split(*idleLibs, ",") {
		if name, path, ok := strings.Cut(kv, "="); ok {
			libs = append(libs, struct{ name, path string }{name, path})
		} else if kv != "" {
			return fmt.Errorf("-idle-libs: %q is not name=path", kv)
		}
	}
	tmpl, err := template.New("idle").Parse(idleConf)
	if err != nil {
		return err
	}
	var runs []*idleRun
	defer func() {
		for _, r := range runs {
			r.n.stop()
		}
	}()
	start := func(name, mode, lib string, workers int) (*idleRun, error) {
		n, err := e.newNginx("nginx", filepath.Join(e.dir, "idle-"+mode+name), "builtin", "")
		if err != nil {
			return nil, err
		}
		n.tmpl = tmpl
		// A copy of its own for each nginx: the pages of a file count in
		// the PSS of every process that maps them, so no other worker
		// (the other nginx here, the main one of the earlier figures)
		// may share them.
		own := filepath.Join(n.dir, "lib", "libffi_qrpc.so")
		if err := installCopy(lib, own); err != nil {
			return nil, err
		}
		lib = own
		_, port, _ := strings.Cut(e.qrpcAddr, ":")
		for k, v := range map[string]any{"Mode": mode, "Lib": lib, "Calling": idleCalling, "Burst": *idleBurst,
			"PoolAddr": poolName + ":" + port, "Resolver": dns.Addr, "CheckMS": idleCheckMS, "ResolveMS": idleResolveMS} {
			n.data[k] = v
		}
		r := &idleRun{name: name, n: n}
		runs = append(runs, r)
		if err := n.start(nginxOpts{workers: workers, gomaxprocs: p.main.gomaxprocs, godebug: p.main.godebug}); err != nil {
			return nil, err
		}
		// /pid answers once one worker is up: the others may still be
		// forking.
		for deadline := time.Now().Add(10 * time.Second); len(r.pids) < workers; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%d of %d workers after 10 s", len(r.pids), workers)
			}
			if r.pids, err = n.workers(); err != nil {
				return nil, err
			}
		}
		return r, nil
	}
	var calls []*idleRun
	for _, l := range libs {
		r, err := start(l.name, "calls", l.path, idleWorkers)
		if err != nil {
			return err
		}
		calls = append(calls, r)
	}
	pool, err := start("", "pool", e.lib, 5)
	if err != nil {
		return err
	}
	var pids []int
	for _, r := range runs {
		pids = append(pids, r.pids...)
	}
	// The sampler reads every worker before any call starts: the windows
	// are cut from each worker's call on.
	smp := startSampler(pids)
	<-smp.first
	for _, r := range runs {
		if err := os.WriteFile(filepath.Join(r.n.dir, "go"), nil, 0o644); err != nil {
			smp.stop()
			return err
		}
	}
	var last time.Time
	for _, r := range runs {
		want := idleCalling
		if r == pool {
			want = 4
		}
		if err := r.waitDone(want, 60*time.Second); err != nil {
			smp.stop()
			return err
		}
		if err := r.checkCalls(want); err != nil {
			smp.stop()
			return err
		}
		for _, end := range r.ends {
			if end.After(last) {
				last = end
			}
		}
	}
	log.Printf("idle: %d nginx, workers called or connected by %s; %s to settle, then a %s window", len(runs), last.Format("15:04:05.000"), settle, window)
	time.Sleep(time.Until(last.Add(settle + window + 2*cswEvery)))
	series := smp.stop()
	for _, r := range calls {
		if err := r.report(t, series, settle, window); err != nil {
			return err
		}
	}
	if err := pool.reportPool(t, series, settle, window); err != nil {
		return err
	}
	if p.holdIdle {
		log.Printf("holding: idle nginx, prefixes %s and %s; Ctrl-C to end", calls[0].n.dir, pool.n.dir)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
	}
	// An idle dispatcher must still notice the worker exit at once
	// (Kong#6904): how long the old workers take to go after a reload.
	reload, err := reloadTime(calls[0].n, calls[0].pids)
	if err != nil {
		return err
	}
	t.add(row{section: calls[0].section(settle, window), name: "nginx -s reload: until the idle old workers are gone",
		subject: fmt.Sprintf("%.2f s", reload.Seconds()), baseline: "—", noRatio: true,
		target: "≤ 1 s", met: reload <= time.Second})
	return nil
}

// waitDone waits until want workers have logged that their call (or
// connect) is done, and records when.
func (r *idleRun) waitDone(want int, limit time.Duration) error {
	r.ends, r.roles = map[int]time.Time{}, map[int]string{}
	for deadline := time.Now().Add(limit); len(r.ends) < want; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d workers done; error.log:\n%s", len(r.ends), want, tail(filepath.Join(r.n.dir, "error.log")))
		}
		b, _ := os.ReadFile(filepath.Join(r.n.dir, "error.log"))
		for _, line := range strings.Split(string(b), "\n") {
			_, rest, ok := strings.Cut(line, "idle-bench: pid ")
			if !ok {
				continue
			}
			// "<pid> <role> <ok|error> at <ngx.now()>, client: ..."
			f := strings.Fields(rest)
			if len(f) < 5 || f[2] != "ok" || f[3] != "at" {
				return fmt.Errorf("a worker's call failed: %s", line)
			}
			pid, _ := strconv.Atoi(f[0])
			at, err := strconv.ParseFloat(strings.TrimSuffix(f[4], ","), 64)
			if err != nil {
				return fmt.Errorf("bad time in %q", line)
			}
			r.ends[pid] = time.Unix(0, int64(at*1e9))
			r.roles[pid] = f[1]
		}
	}
	return nil
}

// checkCalls reads the per-worker call counter: each of the want workers
// that logged its call must have counted it, and no other worker any.
func (r *idleRun) checkCalls(want int) error {
	body, err := r.n.get("/calls")
	if err != nil {
		return err
	}
	counted := map[int]int{}
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		var pid, n int
		if _, err := fmt.Sscanf(l, "%d %d", &pid, &n); err == nil {
			counted[pid] = n
		}
	}
	for pid := range r.ends {
		if counted[pid] < 1 {
			return fmt.Errorf("idle %s: worker %d logged its call but counted %d calls (%q)", r.label(), pid, counted[pid], body)
		}
	}
	if len(counted) != len(r.ends) || len(r.ends) != want {
		return fmt.Errorf("idle %s: %d workers counted calls, %d logged one, want %d (%q)", r.label(), len(counted), len(r.ends), want, body)
	}
	r.counted = len(counted)
	return nil
}

// medianEnd is the middle one of the workers' ends: the plain workers'
// windows are cut there.
func (r *idleRun) medianEnd() time.Time {
	var ts []time.Time
	for _, t := range r.ends {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	return ts[len(ts)/2]
}

// idleReading is one worker's figures in both windows.
type idleReading struct {
	pid                int
	role               string
	loaded             bool
	busy, idle         memSample // just after the call; at the end of the idle window
	transMain, transGo int64     // wake-ups in the transition
	transSecs          float64
	idleMain, idleGo   float64 // wake-ups/s in the idle window
}

func (r *idleRun) readings(series map[int]*procSeries, settle, window time.Duration) ([]idleReading, error) {
	mid := r.medianEnd()
	var out []idleReading
	for _, pid := range r.pids {
		ps := series[pid]
		end, ok := r.ends[pid]
		if !ok {
			end = mid
		}
		w := idleReading{pid: pid, role: r.roles[pid], loaded: libLoaded(pid)}
		if w.role == "" {
			w.role = "plain"
		}
		var err error
		if w.transMain, w.transGo, w.transSecs, err = ps.wakeups(end, end.Add(settle)); err != nil {
			return nil, err
		}
		m, g, secs, err := ps.wakeups(end.Add(settle), end.Add(settle+window))
		if err != nil {
			return nil, err
		}
		w.idleMain, w.idleGo = float64(m)/secs, float64(g)/secs
		if w.busy, err = ps.memAt(end); err != nil {
			return nil, err
		}
		if w.idle, err = ps.memAt(end.Add(settle + window)); err != nil {
			return nil, err
		}
		log.Printf("idle %s: pid %d %s: transition %d+%d wake-ups in %.1f s; idle %.2f+%.2f/s; after the call PSS %.1f private %.1f RSS %.1f MB; idle PSS %.1f private %.1f RSS %.1f MB, %d threads",
			r.label(), pid, w.role, w.transMain, w.transGo, w.transSecs, w.idleMain, w.idleGo,
			mb(w.busy.pss), mb(w.busy.priv), mb(w.busy.rss), mb(w.idle.pss), mb(w.idle.priv), mb(w.idle.rss), w.idle.threads)
		out = append(out, w)
	}
	return out, nil
}

func mb(kb int) float64 { return float64(kb) / 1024 }

func (r *idleRun) label() string {
	if r.name == "" {
		return "main"
	}
	return r.name
}

func (r *idleRun) section(settle, window time.Duration) string {
	s := fmt.Sprintf("Idle worker: one call, then quiet (%d workers: %d call, %d plain; %.0f s transition, %.0f s window)",
		idleWorkers, idleCalling, idleWorkers-idleCalling, settle.Seconds(), window.Seconds())
	if *idleBurst > 0 {
		s = strings.Replace(s, "one call,", fmt.Sprintf("one call and %d concurrent 64 KB echoes,", *idleBurst), 1)
	}
	if r.name != "" {
		s = strings.Replace(s, "Idle worker:", "Idle worker: the "+r.name+" build,", 1)
	}
	return s
}

// report adds the rows of a calling nginx.
func (r *idleRun) report(t *table, series map[int]*procSeries, settle, window time.Duration) error {
	ws, err := r.readings(series, settle, window)
	if err != nil {
		return err
	}
	var q, plain idleAvg
	for _, w := range ws {
		if w.role == "call" {
			q.add(w)
		} else {
			plain.add(w)
		}
	}
	if q.n == 0 || plain.n == 0 {
		return fmt.Errorf("idle: %d calling and %d plain workers", q.n, plain.n)
	}
	sec := r.section(settle, window)
	mem := func(name string, get func(idleReading) int, target float64) {
		x, y := q.mem(get), plain.mem(get)
		rw := row{section: sec, name: name, subject: fmt.Sprintf("%.1f MB", x), baseline: fmt.Sprintf("%.1f MB plain", y),
			ratio: x - y, ratioLabel: "extra MB"}
		if target > 0 {
			rw = rw.withTarget(fmt.Sprintf("≤ %g", target))
		}
		t.add(rw)
	}
	mem("PSS per worker, idle (smaps_rollup Pss: shared pages split among the processes that map them)", func(w idleReading) int { return w.idle.pss }, 6)
	mem("private memory per worker, idle (USS: Private_Clean + Private_Dirty)", func(w idleReading) int { return w.idle.priv }, 5)
	qhz, phz := q.idleHz(), plain.idleHz()
	t.add(row{section: sec, name: "wake-ups/s per worker, steady idle window after the transition (keep-alives every 15 s; context switches of all its threads: nginx's + the others)",
		subject:  fmt.Sprintf("%.2f (%.2f + %.2f)", qhz, q.idleMain/float64(q.n), q.idleGo/float64(q.n)),
		baseline: fmt.Sprintf("%.2f plain", phz), ratio: qhz - phz, ratioLabel: "extra per s"}.withTarget("≤ 1"))
	qt, pt := q.trans(), plain.trans()
	t.add(row{section: sec, name: fmt.Sprintf("wake-ups per worker in the transition (the %.0f s after the call: the call's last packets, the trimmer, the first keep-alive; nginx's + the others)", settle.Seconds()),
		subject:  fmt.Sprintf("%.0f (%.0f + %.0f)", qt, float64(q.transMain)/float64(q.n), float64(q.transGo)/float64(q.n)),
		baseline: fmt.Sprintf("%.0f plain", pt), ratio: qt - pt, ratioLabel: "extra"}.withTarget("≤ 60"))
	mem("PSS per worker just after the call", func(w idleReading) int { return w.busy.pss }, 0)
	mem("private memory per worker just after the call", func(w idleReading) int { return w.busy.priv }, 0)
	mem("RSS per worker, idle (for reference: counts the library's pages, one copy in the page cache, in every worker)", func(w idleReading) int { return w.idle.rss }, 0)
	qth, pth := q.threads(), plain.threads()
	t.add(row{section: sec, name: "threads per worker, idle (a parked thread costs its stacks, counted in private memory)",
		subject: fmt.Sprintf("%.1f", qth), baseline: fmt.Sprintf("%.1f plain", pth), ratio: qth - pth, ratioLabel: "extra threads"})
	t.add(row{section: sec, name: "calling workers whose call the per-worker counter saw",
		subject: fmt.Sprintf("%d of %d", r.counted, q.n), baseline: "—", noRatio: true,
		target: fmt.Sprint(idleCalling), met: r.counted == idleCalling && q.n == idleCalling})
	r.timeline(series, settle+window)
	t.add(row{section: sec, name: "plain workers with the library loaded",
		subject: fmt.Sprintf("%d of %d", plain.loaded, plain.n), baseline: "—", noRatio: true,
		target: "0", met: plain.loaded == 0})
	return nil
}

// timeline logs the calling workers' mean wake-ups in each second after
// their call, so that a reader sees what wakes when (the trimmer's ticks,
// each keep-alive). The seconds share their edges:
// every switch falls in one of them.
func (r *idleRun) timeline(series map[int]*procSeries, span time.Duration) {
	secs := int(span / time.Second)
	sum := make([]float64, secs)
	for pid, end := range r.ends {
		prev := series[pid].switchesAt(end)
		for i := range sum {
			c := series[pid].switchesAt(end.Add(time.Duration(i+1) * time.Second))
			sum[i] += float64(c-prev) / float64(len(r.ends))
			prev = c
		}
	}
	var b strings.Builder
	for i, v := range sum {
		if v >= 0.05 {
			fmt.Fprintf(&b, " %d s: %.1f;", i, v)
		}
	}
	log.Printf("idle %s: calling workers' mean wake-ups in each second after the call (the others none):%s", r.label(), b.String())
}

// reportPool adds the rows of the shared pool's nginx.
func (r *idleRun) reportPool(t *table, series map[int]*procSeries, settle, window time.Duration) error {
	leases, err := r.n.get("/leases")
	if err != nil {
		return err
	}
	holders := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(leases), "\n") {
		if role, pid, ok := strings.Cut(l, " "); ok {
			holders[role], _ = strconv.Atoi(pid)
		}
	}
	holder := holders["probe"]
	if holder == 0 || holders["dns"] != holder || r.roles[holder] != "shared" {
		return fmt.Errorf("idle pool: the leases are %q, want both held by one of the shared workers %v", leases, r.roles)
	}
	ws, err := r.readings(series, settle, window)
	if err != nil {
		return err
	}
	var hold, follow, unshared, quiet, plain *idleReading
	for i, w := range ws {
		switch {
		case w.pid == holder:
			hold = &ws[i]
		case w.role == "shared":
			follow = &ws[i]
		case w.role == "unshared":
			unshared = &ws[i]
		case w.role == "quiet":
			quiet = &ws[i]
		default:
			plain = &ws[i]
		}
	}
	if hold == nil || follow == nil || unshared == nil || quiet == nil || plain == nil {
		return fmt.Errorf("idle pool: roles %v", r.roles)
	}
	sec := fmt.Sprintf("Idle worker: a shared pool (check every %d ms, resolve every %d ms), 5 workers, %.0f s window after %.0f s",
		idleCheckMS, idleResolveMS, window.Seconds(), settle.Seconds())
	hz := func(w *idleReading) string {
		return fmt.Sprintf("%.2f (%.2f + %.2f)", w.idleMain+w.idleGo, w.idleMain, w.idleGo)
	}
	tot := func(w *idleReading) float64 { return w.idleMain + w.idleGo }
	t.add(row{section: sec, name: "wake-ups/s of the worker holding the probe and resolve leases (nginx's + the others) vs the same pool unshared",
		subject: hz(hold), baseline: hz(unshared) + " unshared", ratio: tot(hold) - tot(unshared), ratioLabel: "extra per s"}.withTarget("≤ 1"))
	t.add(row{section: sec, name: "of those, the lease holder's nginx thread vs the unshared pool's",
		subject: fmt.Sprintf("%.2f", hold.idleMain), baseline: fmt.Sprintf("%.2f unshared", unshared.idleMain),
		ratio: hold.idleMain - unshared.idleMain, ratioLabel: "extra per s"})
	t.add(row{section: sec, name: "wake-ups/s of a worker following the shared pool (no lease) vs the same pool unshared without checks or re-resolution",
		subject: hz(follow), baseline: hz(quiet) + " quiet", ratio: tot(follow) - tot(quiet), ratioLabel: "extra per s"}.withTarget("≤ 1"))
	t.add(row{section: sec, name: "wake-ups/s of the unshared pool (its checks and re-resolution) vs a plain worker",
		subject: hz(unshared), baseline: hz(plain) + " plain", ratio: tot(unshared) - tot(plain), ratioLabel: "extra per s"})
	t.add(row{section: sec, name: "wake-ups/s of the quiet pool (one connection, its keep-alives) vs a plain worker",
		subject: hz(quiet), baseline: hz(plain) + " plain", ratio: tot(quiet) - tot(plain), ratioLabel: "extra per s"})
	return nil
}

// installCopy copies the library as make install does, into a directory
// the workers can read.
func installCopy(from, to string) error {
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("install", "-m", "755", from, to).CombinedOutput(); err != nil {
		return fmt.Errorf("install %s: %v: %s", to, err, out)
	}
	return nil
}

// libLoaded says whether pid has a build of the library mapped.
func libLoaded(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	return err == nil && strings.Contains(string(b), "libffi_qrpc")
}

// reloadTime reloads n and waits until the workers pids have exited.
func reloadTime(n *nginx, pids []int) (time.Duration, error) {
	began := time.Now()
	if out, err := exec.Command(n.bin, n.args("-s", "reload")...).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("reload: %v: %s", err, out)
	}
	for _, pid := range pids {
		for {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
				break
			}
			if time.Since(began) > 30*time.Second {
				return 0, fmt.Errorf("worker %d still there 30 s after a reload; error.log:\n%s", pid, tail(filepath.Join(n.dir, "error.log")))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return time.Since(began), nil
}

// idleAvg sums one side's workers.
type idleAvg struct {
	n, loaded          int
	readings           []idleReading
	transMain, transGo int64
	idleMain, idleGo   float64
}

func (a *idleAvg) add(w idleReading) {
	a.n++
	a.readings = append(a.readings, w)
	a.transMain += w.transMain
	a.transGo += w.transGo
	a.idleMain += w.idleMain
	a.idleGo += w.idleGo
	if w.loaded {
		a.loaded++
	}
}

// mem is the mean of get over the workers, in MB.
func (a idleAvg) mem(get func(idleReading) int) float64 {
	s := 0
	for _, w := range a.readings {
		s += get(w)
	}
	return mb(s) / float64(a.n)
}

func (a idleAvg) threads() float64 {
	s := 0
	for _, w := range a.readings {
		s += w.idle.threads
	}
	return float64(s) / float64(a.n)
}

func (a idleAvg) idleHz() float64 { return (a.idleMain + a.idleGo) / float64(a.n) }
func (a idleAvg) trans() float64  { return float64(a.transMain+a.transGo) / float64(a.n) }
