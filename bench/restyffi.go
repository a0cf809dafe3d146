package main

// lua-resty-ffi baseline: with an nginx built for lua-resty-ffi (-resty-nginx
// or QRPC_NGINX), the IPC echo of this module's built-in host against
// lua-resty-ffi's own Go echo example, and unary calls through
// host = "resty_ffi" against the built-in host. Both sides run in the same
// nginx binary: one instance per host, started side by side, measured
// alternately.

import (
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

const secResty = "lua-resty-ffi baseline (the same nginx binary, rebuilt for lua-resty-ffi; 1 worker each)"

// restyLibDir is PREFIX/lib of a build-resty-ffi.sh PREFIX, or why bin
// cannot serve as lua-resty-ffi's nginx.
func restyLibDir(bin string) (string, string) {
	if bin == "" {
		return "", "no nginx built for lua-resty-ffi given (-resty-nginx PATH or QRPC_NGINX=PATH; build one with make nginx-resty-ffi, then PATH = $QRPC_BUILD_DIR/resty-ffi/sbin/nginx)"
	}
	if _, err := exec.LookPath(bin); err != nil {
		return "", fmt.Sprintf("%s: %v", bin, err)
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err.Error()
	}
	lib := filepath.Join(filepath.Dir(filepath.Dir(abs)), "lib")
	for _, f := range []string{"libresty_ffi.so", "resty_ffi.lua", "libffi_go_echo.so"} {
		if _, err := os.Stat(filepath.Join(lib, f)); err != nil {
			return "", fmt.Sprintf("%s is not a build for lua-resty-ffi: no %s in %s", bin, f, lib)
		}
	}
	return lib, ""
}

func figureRestyFFI(e *env, p params, t *table) error {
	lib, why := restyLibDir(p.restyNginx)
	if why != "" {
		t.note("lua-resty-ffi baseline skipped: %s.", why)
		log.Printf("restyffi: skipped: %s", why)
		return nil
	}
	builtin, err := e.newNginx(p.restyNginx, filepath.Join(e.dir, "rf-builtin"), "builtin", lib)
	if err != nil {
		return err
	}
	resty, err := e.newNginx(p.restyNginx, filepath.Join(e.dir, "rf-resty"), "resty_ffi", lib)
	if err != nil {
		return err
	}
	for _, n := range []*nginx{builtin, resty} {
		if err := n.start(p.main); err != nil {
			return err
		}
		defer n.stop()
	}
	// The host that carries the calls, as the library reports it: a
	// figure under a wrong label would be worse than none.
	for _, c := range []struct {
		n    *nginx
		host string
	}{{builtin, "builtin"}, {resty, "resty_ffi"}} {
		got, err := c.n.get("/host")
		if err != nil {
			return err
		}
		if strings.TrimSpace(got) != c.host {
			return fmt.Errorf("nginx %s runs host %q, want %q", c.n.dir, got, c.host)
		}
	}
	// Both echoes cross to a Go thread and back: lua-resty-ffi's to its
	// Go thread, the built-in host's through the C submit queue to Go's
	// submitter goroutine, as every unary call of the built-in host does.
	echoes := []struct{ kind, label string }{
		{"ipc", ", through the submit queue to Go's submitter and back (a unary call's hand-off)"},
	}
	for _, size := range p.rfSizes {
		// Long enough runs: at a million calls a second, the IPC
		// section's count takes 50 ms, and single runs of it gave ratios
		// from 1.3 to 2.8 at 512 B.
		calls := echoCalls(p)
		if size > 64<<10 {
			calls = p.ipcParN // 100 KB echoes: what keeps the full run under ten minutes
		}
		for _, echo := range echoes {
			log.Printf("restyffi: %s echo %s, %d light threads", echo.kind, sizeName(size), p.conc)
			qs, rs, err := pairStats(p.runs,
				builtin.stats(echo.kind, calls, size, p.conc),
				builtin.stats("rfecho", calls, size, p.conc))
			if err != nil {
				return err
			}
			name := fmt.Sprintf("IPC echo %s, %d light threads%s: built-in host vs lua-resty-ffi's Go echo example", sizeName(size), p.conc, echo.label)
			addEchoRows(t, name, calls, qs, rs, "≥ 2")
		}
	}
	if err := echoFloor(builtin, p, t); err != nil {
		return err
	}
	if err := echoPlacements(builtin, p, t, echoes); err != nil {
		return err
	}
	log.Printf("restyffi: unary sequential")
	q, r, err := pair(p.runs,
		builtin.measure("unary", p.placeN, 100, 1),
		resty.measure("unary", p.placeN, 100, 1))
	if err != nil {
		return err
	}
	t.add(timeRow(secResty, fmt.Sprintf("unary 100 B, %d sequential calls: host builtin vs resty_ffi: time", p.placeN), q, r))
	log.Printf("restyffi: unary, %d light threads", p.conc)
	q, r, err = pair(p.runs,
		builtin.measure("unary", p.parN, 100, p.conc),
		resty.measure("unary", p.parN, 100, p.conc))
	if err != nil {
		return err
	}
	t.add(rateRow(secResty, fmt.Sprintf("unary 100 B, %d light threads: host builtin vs resty_ffi: throughput", p.conc), p.parN, q, r))
	return nil
}

// echoCalls is the number of calls of an echo run up to 64 KB.
func echoCalls(p params) int { return 10 * p.ipcParN }

// addEchoRows adds an echo pair's throughput (with target, "" for none)
// and worker CPU per call.
func addEchoRows(t *table, name string, calls int, subject, baseline []callStats, target string) {
	r := rateRow(secResty, name+": throughput", calls, secs(medianBy(subject, statSecs)), secs(medianBy(baseline, statSecs)))
	if target != "" {
		r = r.withTarget(target)
	}
	t.add(r)
	// The steadier figure on a shared machine: both echoes run in one
	// worker, so its CPU clock (every thread, both Go runtimes) prices
	// each call the same way.
	n := float64(calls)
	t.add(cpuRow(secResty, name+": worker CPU per call", medianBy(subject, statCPUSecs)*1e6/n, medianBy(baseline, statCPUSecs)*1e6/n))
}

// echoFloor adds the floor of an ngx.semaphore wake-up against
// lua-resty-ffi's 512 B echo: what stock ngx_lua's wake-ups and a
// Lua-built result cost with no IPC at all, so the most any design that
// wakes its calls with ngx.semaphore could reach.
func echoFloor(n *nginx, p params, t *table) error {
	const size = 512
	calls := echoCalls(p)
	log.Printf("restyffi: ngx.semaphore floor %s", sizeName(size))
	fs, rs, err := pairStats(p.runs, n.stats("semafloor", calls, size, p.conc), n.stats("rfecho", calls, size, p.conc))
	if err != nil {
		return err
	}
	addEchoRows(t, fmt.Sprintf("floor of an ngx.semaphore wake-up (no IPC: each call's waiter woken by one light thread with a result table and a %s string built in Lua), %d light threads: vs lua-resty-ffi's Go echo example", sizeName(size), p.conc), calls, fs, rs, "")
	return nil
}

// threadPlacement pins the worker's threads for the placed echo rows.
type threadPlacement struct {
	name  string
	split bool // the nginx thread on CPU 0, every other thread on CPU 1
}

// Unpinned, the echoes move with where the kernel (and the hypervisor)
// put the worker's threads: lua-resty-ffi's 512 B echo takes one of two
// speeds, nearly 2x apart, from run to run. With every thread on CPU 0 it
// takes the slow one; split, either. These rows show both.
var threadPlacements = []threadPlacement{
	{"every thread of the worker on CPU 0", false},
	{"the nginx thread on CPU 0, the worker's other threads on CPU 1", true},
}

// placeThreads pins the threads of worker pid as pl says. Threads started
// later inherit the mask of the thread that starts them: it is applied
// again before each run.
func placeThreads(pid int, pl threadPlacement) error {
	if !pl.split {
		return setAffinity(pid, []int{0})
	}
	return forThreads(pid, func(tid int) error {
		cpu := 1
		if tid == pid {
			cpu = 0
		}
		return setThreadAffinity(tid, []int{cpu})
	})
}

// echoPlacements adds the 512 B echo rows for each thread placement.
func echoPlacements(n *nginx, p params, t *table, echoes []struct{ kind, label string }) error {
	if runtime.NumCPU() < 2 {
		t.note("lua-resty-ffi echo by thread placement skipped: one CPU.")
		return nil
	}
	pids, err := n.workers()
	if err != nil {
		return err
	}
	pid := pids[0]
	defer func() {
		if err := setAffinity(pid, allCPUs()); err != nil {
			log.Printf("restyffi: unpin worker: %v", err)
		}
	}()
	placed := func(pl threadPlacement, f func() (callStats, error)) func() (callStats, error) {
		return func() (callStats, error) {
			if err := placeThreads(pid, pl); err != nil {
				return callStats{}, err
			}
			return f()
		}
	}
	const size = 512
	calls := echoCalls(p)
	for _, pl := range threadPlacements {
		for _, echo := range echoes {
			log.Printf("restyffi: %s echo %s, %s", echo.kind, sizeName(size), pl.name)
			qs, rs, err := pairStats(p.runs,
				placed(pl, n.stats(echo.kind, calls, size, p.conc)),
				placed(pl, n.stats("rfecho", calls, size, p.conc)))
			if err != nil {
				return err
			}
			addEchoRows(t, fmt.Sprintf("%s: IPC echo %s, %d light threads%s: built-in host vs lua-resty-ffi's Go echo example", pl.name, sizeName(size), p.conc, echo.label), calls, qs, rs, "≥ 2")
		}
	}
	return nil
}
