package main

// Where a sequential call goes: the pinned 100 B sequential case (nginx
// worker on CPU 0, the library's default GOMAXPROCS, as in placement.go)
// profiled with `perf record` on the worker, side by side with the same
// profile of the Go client making the same calls. Each sample's CPU time
// (its period) goes to a component by the function it was taken in
// (attribute.go), the kernel's by the system call it was in. Flame graphs
// of both profiles are written beside the report (flame.go), and the
// LuaJIT trace log of the call path (jit.v after a jit.flush) is read for
// aborted traces.

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// perfFreq is the sampling frequency: on a VM without hardware counters
// perf samples cpu-clock, whose timer interrupts cost the profiled
// threads CPU of their own; at ~1 ms a run of 20,000 calls still gives a
// few thousand samples.
const perfFreq = 999

// perfUsable says why the breakdown cannot run here, or "".
func perfUsable() string {
	if why := placementUsable(); why != "" {
		return why
	}
	if _, err := exec.LookPath("perf"); err != nil {
		return "perf not installed"
	}
	if out, err := exec.Command("perf", "record", "-F", "99", "-g", "-o", "/dev/null", "true").CombinedOutput(); err != nil {
		return fmt.Sprintf("perf record does not run: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return ""
}

// profile is one perf profile read into stacks.
type profile struct {
	samples []sample
	calls   int // the calls made while it was recorded
}

// sample is one perf sample: its CPU time, the thread, and the stack from
// the leaf out.
type sample struct {
	ns     int64
	main   bool // the process's first thread (the nginx thread; the Go client's main thread)
	frames []frame
}

type frame struct{ sym, dso string }

// recordWorker profiles the worker while run makes its calls.
func recordWorker(pid int, out string, run func() error) error {
	cmd := exec.Command("perf", "record", "-F", strconv.Itoa(perfFreq), "-g", "-p", strconv.Itoa(pid), "-o", out)
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		return err
	}
	// perf attaches to every thread of pid before it prints anything; a
	// run started before that loses its first samples, nothing else.
	time.Sleep(500 * time.Millisecond)
	runErr := run()
	_ = cmd.Process.Signal(syscall.SIGINT)
	// perf ends by the SIGINT: its exit status says so, its output says
	// whether it wrote the data
	if err := cmd.Wait(); err != nil && runErr == nil && !strings.Contains(errb.String(), "Captured and wrote") {
		return fmt.Errorf("perf record: %v: %s", err, errb.String())
	}
	return runErr
}

// readProfile runs perf script on a recording; mainTID is the thread
// that counts as main (0 = each process's pid).
func readProfile(data string) ([]sample, error) {
	cmd := exec.Command("perf", "script", "-i", data, "-F", "pid,tid,period,ip,sym,dso")
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	samples, perr := parsePerfScript(out)
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("perf script %s: %w: %s", data, err, errb.String())
	}
	if len(samples) == 0 {
		return nil, fmt.Errorf("perf script %s: no samples: %s", data, errb.String())
	}
	return samples, perr
}

// parsePerfScript reads `perf script -F pid,tid,period,ip,sym,dso`: a
// header line "pid/tid period" per sample, then its stack, one frame a
// line ("addr sym (dso)"), then a blank line.
func parsePerfScript(r io.Reader) ([]sample, error) {
	var out []sample
	var cur *sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.TrimSpace(l) == "" {
			cur = nil
			continue
		}
		// frames start with a tab; a sample's line may start with the
		// spaces that right-align its pid
		if l[0] != '\t' {
			f := strings.Fields(l)
			if len(f) < 2 {
				return nil, fmt.Errorf("perf script: bad sample line %q", l)
			}
			pid, tid, ok := strings.Cut(f[0], "/")
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if !ok || err != nil {
				return nil, fmt.Errorf("perf script: bad sample line %q", l)
			}
			out = append(out, sample{ns: ns, main: pid == tid})
			cur = &out[len(out)-1]
			continue
		}
		if cur == nil {
			continue
		}
		f := strings.TrimSpace(l)
		_, rest, _ := strings.Cut(f, " ") // the address
		sym, dso := rest, ""
		if i := strings.LastIndex(rest, " ("); i >= 0 && strings.HasSuffix(rest, ")") {
			sym, dso = rest[:i], rest[i+2:len(rest)-1]
		}
		if j := strings.LastIndex(sym, "+0x"); j > 0 {
			sym = sym[:j]
		}
		cur.frames = append(cur.frames, frame{sym: sym, dso: dso})
	}
	return out, sc.Err()
}

// breakdown is a profile's CPU time by component, per call.
type breakdown struct {
	perCall map[string]float64 // µs per call
	onMain  map[string]float64 // µs per call on the main thread
	main    float64            // µs per call on the main thread
	total   float64
}

func (p profile) breakdown() breakdown {
	b := breakdown{perCall: map[string]float64{}, onMain: map[string]float64{}}
	n := float64(p.calls)
	for _, s := range p.samples {
		us := float64(s.ns) / 1e3 / n
		c := component(s.frames, s.main)
		b.perCall[c] += us
		b.total += us
		if s.main {
			b.main += us
			b.onMain[c] += us
		}
	}
	return b
}

// breakdownCalls is how many sequential calls each profile covers.
func breakdownCalls(p params) int {
	if p.quick {
		return 5000
	}
	return 20000
}

func figureBreakdown(e *env, p params, t *table) error {
	defer e.restore(p)
	if why := perfUsable(); why != "" {
		t.note("Breakdown of a sequential call skipped: %s.", why)
		return nil
	}
	pl := placement{name: "pinned to CPU 0, default GOMAXPROCS (1)", pin: true}
	if err := e.apply(pl); err != nil {
		return err
	}
	n := breakdownCalls(p)
	// bench.lua and the Go client warm up with a tenth of the calls (at
	// most warmupMax) inside the same request or process: the profiles
	// cover those too.
	calls := n + min(n/10+1, warmupMax)
	if _, err := e.nginx.lua("unary", 2000, 100, 1); err != nil {
		return err
	}
	ws, err := e.nginx.workers()
	if err != nil {
		return err
	}
	dir := filepath.Join(e.dir, "breakdown")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	log.Printf("breakdown: %d sequential calls under perf, nginx worker then Go client", n)
	var ls, gs callStats
	wdata, gdata := filepath.Join(dir, "worker.data"), filepath.Join(dir, "goclient.data")
	if err := recordWorker(ws[0], wdata, func() error {
		var err error
		ls, err = e.nginx.stats("unary", n, 100, 1)()
		return err
	}); err != nil {
		return err
	}
	perfRec := func(data string) []string {
		return []string{"perf", "record", "-F", strconv.Itoa(perfFreq), "-g", "-o", data, "--"}
	}
	if gs, err = e.goClientUnder(pl, perfRec(gdata), n, "seq"); err != nil {
		return err
	}
	fdata := filepath.Join(dir, "floor.data")
	fs, err := e.goClientUnder(pl, perfRec(fdata), n, "floor-"+floorNginx)
	if err != nil {
		return err
	}
	fsam, err := readProfile(fdata)
	if err != nil {
		return err
	}
	lsam, err := readProfile(wdata)
	if err != nil {
		return err
	}
	gsam, err := readProfile(gdata)
	if err != nil {
		return err
	}
	if len(lsam) == 0 || len(gsam) == 0 || len(fsam) == 0 {
		return fmt.Errorf("perf recorded no samples (worker %d, Go client %d, design floor %d)", len(lsam), len(gsam), len(fsam))
	}
	lp, gp, fp := profile{samples: lsam, calls: calls}, profile{samples: gsam, calls: calls}, profile{samples: fsam, calls: calls}
	lb, gb, fb := lp.breakdown(), gp.breakdown(), fp.breakdown()
	sec := fmt.Sprintf("Where a sequential call goes (pinned to CPU 0, default GOMAXPROCS (1), 100 B, %d calls under perf record -F %d -g: CPU per call by the function each sample was taken in; worker vs Go client)", n, perfFreq)
	profiledRows(t, sec, n, ls, gs, lb, gb)
	t.add(row{section: sec, name: "of which the main thread (the nginx thread; the Go client's first thread)", subject: fmtUS(lb.main),
		baseline: fmtUS(gb.main), ratio: lb.main / gb.main, ratioLabel: "CPU ratio"})
	componentRows(t, sec, lb, gb)
	// The nginx thread's share alone: what the worker's thread of Lua
	// and nginx spends, apart from the Go threads.
	msec := "Where a sequential call goes: of which the nginx thread (the same profile; Go's threads are the rest)"
	for _, c := range orderedComponents(breakdown{perCall: lb.onMain}, breakdown{}) {
		if lb.onMain[c] >= 0.05 {
			t.add(row{section: msec, name: c, subject: fmtUSShare(lb.onMain[c], lb.main), baseline: "—", noRatio: true})
		}
	}
	// The same worker profile against the design floor's: what the
	// module's own path costs beyond handing calls across as stock nginx
	// must (designfloor.go).
	fsec := fmt.Sprintf("Where a sequential call goes: worker vs the design floor, %s, profiled the same way (%d calls)", floorName[floorNginx], n)
	profiledRows(t, fsec, n, ls, fs, lb, fb)
	componentRows(t, fsec, lb, fb)
	flameBase := strings.TrimSuffix(p.out, ".md")
	if flameBase != "" {
		for _, f := range []struct {
			name, title string
			pr          profile
		}{
			{"worker", fmt.Sprintf("nginx worker, %d sequential 100 B calls, pinned to CPU 0 (%.1f µs CPU per call)", n, lb.total), lp},
			{"goclient", fmt.Sprintf("Go client, %d sequential 100 B calls, pinned to CPU 0 (%.1f µs CPU per call)", n, gb.total), gp},
			{"floor", fmt.Sprintf("design floor, nginx's way, %d sequential 100 B calls, pinned to CPU 0 (%.1f µs CPU per call)", n, fb.total), fp},
		} {
			path := flameBase + "-flame-" + f.name + ".svg"
			if err := os.WriteFile(path, flameSVG(f.title, f.pr), 0o644); err != nil {
				return err
			}
			log.Printf("wrote %s", path)
		}
		b := filepath.Base(flameBase)
		t.note("Flame graphs of the breakdown's profiles: %s-flame-worker.svg, %s-flame-goclient.svg and %s-flame-floor.svg.", b, b, b)
	}
	if err := handoffRows(e, p, t, pl); err != nil {
		return err
	}
	return traceStatus(e, t, sec)
}

// profiledRows are a profiled pair's time and CPU per call (n calls).
func profiledRows(t *table, sec string, n int, as, bs callStats, a, b breakdown) {
	t.add(row{section: sec, name: "time per call while profiled", subject: fmtUS(as.d.Seconds() * 1e6 / float64(n)),
		baseline: fmtUS(bs.d.Seconds() * 1e6 / float64(n)), ratio: as.d.Seconds() / bs.d.Seconds(), ratioLabel: "time ratio"})
	t.add(cpuRow(sec, "CPU per call, all threads (the profile's samples)", a.total, b.total))
}

// componentRows compare two profiles component by component; those
// under 0.05 µs on both sides are left out, and a ratio is given only
// against at least 0.5 µs.
func componentRows(t *table, sec string, a, b breakdown) {
	for _, c := range orderedComponents(a, b) {
		x, y := a.perCall[c], b.perCall[c]
		if x < 0.05 && y < 0.05 {
			continue
		}
		r := row{section: sec, name: c, subject: fmtUSShare(x, a.total), baseline: fmtUSShare(y, b.total), ratioLabel: "CPU ratio"}
		if y >= 0.5 {
			r.ratio = x / y
		} else {
			r.noRatio = true
		}
		t.add(r)
	}
}

// handoffRows splits the sequential call's time, without perf, in
// interleaved rounds: the module's hand-off alone (an IPC echo through
// the submit queue, the submitter, the completion queue, the wake-up
// socket and the dispatcher, no network) against the floor's (a bare
// eventfd ping-pong between two threads, handoff.go), and the call
// against the Go client's plus that hand-off: what is left beyond both
// is the rest of the module's path (Lua, the bridge, the pool). The
// design floors (designfloor.go) make the Go client's calls handed
// across and back in one process, which also pays what the two threads
// cost each other.
func handoffRows(e *env, p params, t *table, pl placement) error {
	n := p.placeN
	var us, ipc, gos []callStats
	var pps []time.Duration
	floors := map[string][]callStats{}
	for i := 0; i < p.runs; i++ {
		u, err := e.nginx.stats("unary", n, 100, 1)()
		if err != nil {
			return err
		}
		c, err := e.nginx.stats("ipc", n, 100, 1)()
		if err != nil {
			return err
		}
		g, err := e.goClient(pl, "seq", n, 100, 1)
		if err != nil {
			return err
		}
		pp, err := pingPong(n)
		if err != nil {
			return err
		}
		us, ipc, gos, pps = append(us, u), append(ipc, c), append(gos, g), append(pps, pp)
		for _, way := range floorWays {
			f, err := e.goClient(pl, "floor-"+way, n, 100, 1)
			if err != nil {
				return err
			}
			floors[way] = append(floors[way], f)
		}
	}
	per := func(s callStats) float64 { return s.d.Seconds() * 1e6 / float64(n) }
	cpu := func(s callStats) float64 { return s.cpu.Seconds() * 1e6 / float64(n) }
	sec := fmt.Sprintf("Where a sequential call goes: the hand-off (pinned to CPU 0, default GOMAXPROCS (1), 100 B, %d calls, no perf, median of %d interleaved runs)", n, p.runs)
	pp := median(pps).Seconds() * 1e6 / float64(n)
	hand, call, goc := medianBy(ipc, per), medianBy(us, per), medianBy(gos, per)
	t.add(row{section: sec, name: "the module's hand-off alone (IPC echo: submit queue, submitter, completion queue, wake-up socket, dispatcher; no network) vs the floor's (eventfd ping-pong between two threads): time per round trip",
		subject: fmtUS(hand), baseline: fmtUS(pp), ratio: hand / pp, ratioLabel: "time ratio"})
	t.add(row{section: sec, name: "IPC echo: worker CPU per round trip", subject: fmtUS(medianBy(ipc, cpu)), baseline: "—", noRatio: true})
	t.add(row{section: sec, name: "unary call vs the Go client's: time per call", subject: fmtUS(call), baseline: fmtUS(goc), ratio: call / goc, ratioLabel: "time ratio"})
	t.add(row{section: sec, name: "unary call vs the Go client's + the floor's hand-off (the floor row of the placement figure)", subject: fmtUS(call), baseline: fmtUS(goc + pp), ratio: call / (goc + pp), ratioLabel: "time ratio"})
	t.add(row{section: sec, name: "unary call vs the Go client's + the module's own hand-off (what the rest of the path adds)", subject: fmtUS(call), baseline: fmtUS(goc + hand), ratio: call / (goc + hand), ratioLabel: "time ratio"})
	t.add(cpuRow(sec, "unary call vs the Go client's: CPU per call (worker vs Go client process)", medianBy(us, cpu), medianBy(gos, cpu)))
	csw := func(s callStats) float64 { return float64(s.csw) / float64(n) }
	for _, way := range floorWays {
		fl := floors[way]
		name := "design floor, " + floorName[way]
		picked := 0.0
		for _, f := range fl {
			picked += float64(f.picks)
		}
		picked = 100 * picked / float64(n*len(fl))
		t.add(row{section: sec, name: name + ": time per call vs the Go client's", subject: fmtUS(medianBy(fl, per)),
			baseline: fmtUS(goc), ratio: medianBy(fl, per) / goc, ratioLabel: "time ratio"})
		t.add(cpuRow(sec, name+": CPU per call vs the Go client's", medianBy(fl, cpu), medianBy(gos, cpu)))
		t.add(row{section: sec, name: fmt.Sprintf("%s: context switches per call (calls taken by the pickup: %.0f%%)", name, picked),
			subject: fmt.Sprintf("%.2f", medianBy(fl, csw)), baseline: fmt.Sprintf("%.2f", medianBy(gos, csw)),
			ratio: medianBy(fl, csw) / medianBy(gos, csw), ratioLabel: "switch ratio"})
	}
	fl := floors[floorNginx]
	t.add(row{section: sec, name: "unary call vs the design floor, " + floorName[floorNginx] + ": time per call", subject: fmtUS(call),
		baseline: fmtUS(medianBy(fl, per)), ratio: call / medianBy(fl, per), ratioLabel: "time ratio"})
	t.add(cpuRow(sec, "unary call vs the design floor, "+floorName[floorNginx]+": CPU per call (what the module's own path adds)", medianBy(us, cpu), medianBy(fl, cpu)))
	return nil
}

// The design floors (designfloor.go), in the order of the rows.
var floorWays = []string{"eventfd", "pickup", floorNginx, "export"}

const floorNginx = "pickup-nginx"

var floorName = map[string]string{
	"eventfd":  "without the pickup (the Go client's calls, each handed from a C thread to a goroutine through an eventfd and back through another)",
	"pickup":   "with the module's pickup (the same, the goroutine looking for the next call right after its answer's wake-up)",
	floorNginx: "nginx's way (the pickup, with each answer woken through a unix socket the C thread waits for in epoll_wait, as a cosocket is)",
	"export":   "without a hand-off of ours (the C thread makes each call inside a Go export and waits there, blocking its event loop: not a design nginx can take)",
}

func fmtUSShare(us, total float64) string {
	if total <= 0 {
		return fmtUS(us)
	}
	return fmt.Sprintf("%.1f µs (%.0f%%)", us, 100*us/total)
}

// orderedComponents lists the components of either profile, the worker's
// largest first.
func orderedComponents(a, b breakdown) []string {
	seen := map[string]bool{}
	var cs []string
	for _, m := range []map[string]float64{a.perCall, b.perCall} {
		for c := range m {
			if !seen[c] {
				seen[c] = true
				cs = append(cs, c)
			}
		}
	}
	sort.Slice(cs, func(i, j int) bool {
		x, y := a.perCall[cs[i]]+b.perCall[cs[i]]/1e3, a.perCall[cs[j]]+b.perCall[cs[j]]/1e3
		if x != y {
			return x > y
		}
		return cs[i] < cs[j]
	})
	return cs
}

// goClientUnder runs the Go client's sequential loop (kind: seq, or a
// design floor's) under a wrapper
// (perf record), placed like pl, from a build of this program that keeps
// its symbol table (symbolBinary): `go run` links without one, and perf
// then names none of the Go client's functions.
func (e *env) goClientUnder(pl placement, wrap []string, n int, kind string) (callStats, error) {
	self, err := symbolBinary(e.root, filepath.Join(e.dir, "breakdown"))
	if err != nil {
		return callStats{}, err
	}
	args := append(append([]string{}, wrap...), "taskset", "-c", "0", self, "-client", e.qrpcAddr, "-ca", e.caFile,
		"-kind", kind, "-n", strconv.Itoa(n), "-size", "100", "-c", "1")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = withoutEnv(os.Environ(), "GOMAXPROCS")
	if pl.gomaxprocs != "" {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+pl.gomaxprocs)
	}
	cmd.Stderr = io.Discard // perf's own lines
	out, err := outputBounded(cmd)
	if err != nil {
		return callStats{}, fmt.Errorf("go client under perf: %w", err)
	}
	// perf record may print before the child's line
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "SECS ") {
			return parseChild(l)
		}
	}
	return callStats{}, fmt.Errorf("go client under perf answered %q", out)
}

// traceStatus runs the call path once more with LuaJIT's trace log on
// (after jit.flush, so every trace of the loop is compiled again inside
// it) and reports the traces compiled and aborted.
func traceStatus(e *env, t *table, sec string) error {
	logf := filepath.Join(e.nginx.dir, "jitv.log")
	_ = os.Remove(logf)
	if _, err := e.nginx.luaQuery("unary", "kind=unary&n=2000&size=100&c=1&jitv="+logf); err != nil {
		return err
	}
	b, err := os.ReadFile(logf)
	if err != nil {
		t.note("LuaJIT trace status: no jit.v log (%v).", err)
		return nil
	}
	ts := parseJITV(string(b))
	t.add(row{section: sec, name: "LuaJIT traces compiled in 2,000 calls after jit.flush() (jit.v)", subject: strconv.Itoa(ts.compiled), baseline: "—", noRatio: true})
	t.add(row{section: sec, name: "LuaJIT trace aborts in those calls", subject: strconv.Itoa(len(ts.aborts)), baseline: "—", noRatio: true})
	if len(ts.aborts) > 0 {
		t.note("LuaJIT trace aborts on the sequential call path (jit.v, after jit.flush(), 2,000 calls): %s.", strings.Join(ts.summary(), "; "))
	}
	return nil
}

// jitStatus is what a jit.v log says.
type jitStatus struct {
	compiled int
	aborts   []string // "where -- why"
}

// parseJITV reads jit.v's lines: "[TRACE n file:line ...]" for a trace
// compiled, "[TRACE --- file:line -- reason]" for one aborted.
func parseJITV(s string) jitStatus {
	var st jitStatus
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "[TRACE ") {
			continue
		}
		body := strings.TrimSuffix(strings.TrimPrefix(l, "[TRACE "), "]")
		if strings.HasPrefix(body, "--- ") {
			st.aborts = append(st.aborts, strings.TrimPrefix(body, "--- "))
			continue
		}
		st.compiled++
	}
	return st
}

// summary counts the aborts by place and reason.
func (st jitStatus) summary() []string {
	n := map[string]int{}
	for _, a := range st.aborts {
		n[a]++
	}
	var out []string
	for a, c := range n {
		out = append(out, fmt.Sprintf("%s (%d×)", a, c))
	}
	sort.Strings(out)
	return out
}

// symbolBinary builds this program into dir with a symbol table perf
// can read: `go run` links with -s -w, which drop the symbol table and
// DWARF and nothing else, so the machine code is the same as the Go
// client's in the other figures.
func symbolBinary(root, dir string) (string, error) {
	out := filepath.Join(dir, "bench-symbols")
	build := exec.Command("go", "build", "-o", out, "./bench")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("build the Go client with symbols: %w", err)
	}
	if !hasSymtab(out) {
		return "", fmt.Errorf("build the Go client with symbols: %s has no symbol table", out)
	}
	return out, nil
}

// hasSymtab says whether the ELF file at path has a symbol table that
// names its Go functions.
func hasSymtab(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return false
	}
	for _, s := range syms {
		if s.Name == "main.main" {
			return true
		}
	}
	return false
}
