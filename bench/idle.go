package main

// Idle cost: what an nginx worker that made one qrpc call and then sits
// idle costs, against plain Lua workers of the same nginx in the same run.
// One nginx with 2N workers: workers 0..N-1 connect and make one call from
// a timer at start, the others only configure the module (which must not
// load the library). Then, for a quiet window, each worker's RSS, threads
// and voluntary context switches (each one a wake-up of a thread that
// slept), the nginx thread apart from the others (the Go runtime's).

import (
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"
)

const idleConf = `load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes {{.Workers}};
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/error.log warn;
env GOMAXPROCS;
env GODEBUG;
events { worker_connections 1024; }
http {
    access_log off;
    lua_package_path "{{.Dir}}/?.lua;{{.LuaDir}}/?.lua;/usr/share/lua/5.1/?.lua;;";
    client_body_temp_path {{.Dir}}/body;
    proxy_temp_path {{.Dir}}/proxy;
    fastcgi_temp_path {{.Dir}}/fastcgi;
    uwsgi_temp_path {{.Dir}}/uwsgi;
    scgi_temp_path {{.Dir}}/scgi;
    init_worker_by_lua_block {
        local qrpc = require "resty.ffi.qrpc"
        qrpc.configure{ host = "builtin", lib = "{{.Lib}}", socket_dir = "{{.Dir}}" }
        if ngx.worker.id() < {{.Calling}} then
            ngx.timer.at(0, function(premature)
                if premature then return end
                local cfg = require "bench_config"
                local conn, err = qrpc.connect(cfg.addr, { ca = cfg.ca, server_name = "localhost" })
                local res
                if conn then res, err = conn:unary("echo", "hello") end
                ngx.log(ngx.WARN, "idle-bench: pid ", ngx.worker.pid(), " call ", res and "ok" or tostring(err))
            end)
        end
    }
    server {
        listen {{.Port}};
        location = /pid { return 200 "ok"; }
        # /call and /profile: for -hold-idle, by hand
        location = /call {
            content_by_lua_block {
                local qrpc = require "resty.ffi.qrpc"
                local cfg = require "bench_config"
                local conn, err = qrpc.connect(cfg.addr, { ca = cfg.ca, server_name = "localhost" })
                local res
                if conn then res, err = conn:unary("echo", "hello") end
                ngx.say(ngx.worker.pid(), " ", res and "ok" or tostring(err))
            }
        }
        location = /profile {
            content_by_lua_block {
                local p, err = require("resty.ffi.qrpc").debug_profile(ngx.var.arg_kind or "heap")
                if not p then return ngx.say(err) end
                ngx.print(p)
            }
        }
    }
}
`

// taskCSW is each thread's voluntary context switches.
func taskCSW(pid int) (map[int]int64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, d := range ents {
		tid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, d.Name(), "status"))
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				out[tid], _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
	}
	return out, nil
}

// rollupKB is /proc/pid/smaps_rollup's fields, in KB.
func rollupKB(pid int) (map[string]int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "kB" {
			out[strings.TrimSuffix(f[0], ":")], _ = strconv.Atoi(f[1])
		}
	}
	return out, nil
}

// libRSSKB is the resident KB of pid's mappings of the library file (its
// code and data, shared with the other workers but what is written).
func libRSSKB(pid int, lib string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0
	}
	kb, in := 0, false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") || strings.Contains(f[0], "-") {
			// a mapping's header: "start-end perms offset dev inode [path]"
			in = len(f) >= 6 && filepath.Base(f[5]) == filepath.Base(lib)
			continue
		}
		if in && f[0] == "Rss:" {
			v, _ := strconv.Atoi(f[1])
			kb += v
		}
	}
	return kb
}

// libLoaded says whether pid has the library mapped.
func libLoaded(pid int, lib string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	return err == nil && strings.Contains(string(b), filepath.Base(lib))
}

// idleWorker is one worker's reading over the window.
type idleWorker struct {
	pid             int
	rssKB, threads  int
	privKB, libKB   int     // private (clean + dirty) KB; resident KB of the library file
	pssKB           int     // proportional set size: shared pages divided among their users
	nginxHz, goHz   float64 // wake-ups/s of the nginx thread, of all others
	busiestGoHz     float64
	loaded, calling bool
}

func figureIdle(e *env, p params, t *table) error {
	const calling = 4
	// The window spans three keep-alive periods (a third of the default
	// 30 s idle timeout); it starts once the call's after-effects are over
	// (the trimmer's last ticks, quic-go's timers of a fresh connection).
	settle, window := 10*time.Second, 30*time.Second
	if p.quick {
		settle, window = 3*time.Second, 10*time.Second
	}
	n, err := e.newNginx("nginx", filepath.Join(e.dir, "idle"), "builtin", "")
	if err != nil {
		return err
	}
	if n.tmpl, err = template.New("idle").Parse(idleConf); err != nil {
		return err
	}
	n.data["Calling"] = calling
	if err := n.start(nginxOpts{workers: 2 * calling, gomaxprocs: p.main.gomaxprocs, godebug: p.main.godebug}); err != nil {
		return err
	}
	defer n.stop()
	// Each calling worker logs its pid once its call is done.
	called := map[int]bool{}
	for deadline := time.Now().Add(30 * time.Second); len(called) < calling; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d workers made their call; error.log:\n%s", len(called), calling, tail(filepath.Join(n.dir, "error.log")))
		}
		b, _ := os.ReadFile(filepath.Join(n.dir, "error.log"))
		for _, line := range strings.Split(string(b), "\n") {
			_, rest, ok := strings.Cut(line, "idle-bench: pid ")
			if !ok {
				continue
			}
			f := strings.Fields(rest)
			if len(f) < 3 || strings.TrimSuffix(f[2], ",") != "ok" {
				return fmt.Errorf("a worker's call failed: %s", line)
			}
			pid, _ := strconv.Atoi(f[0])
			called[pid] = true
		}
	}
	pids, err := n.workers()
	if err != nil {
		return err
	}
	// Past the call's own after-effects (the dispatcher's first sweeps,
	// the trimmer giving back the call's blocks and stopping).
	time.Sleep(settle)
	before := map[int]map[int]int64{}
	for _, pid := range pids {
		if before[pid], err = taskCSW(pid); err != nil {
			return err
		}
	}
	log.Printf("idle: %d workers %v (%v made a call), %s quiet", len(pids), pids, called, window)
	time.Sleep(window)
	secs := window.Seconds()
	var ws []idleWorker
	for _, pid := range pids {
		after, err := taskCSW(pid)
		if err != nil {
			return err
		}
		rss, err := rssKB(strconv.Itoa(pid))
		if err != nil {
			return err
		}
		roll, err := rollupKB(pid)
		if err != nil {
			return err
		}
		w := idleWorker{pid: pid, rssKB: rss, threads: len(after), loaded: libLoaded(pid, e.lib), calling: called[pid],
			privKB: roll["Private_Clean"] + roll["Private_Dirty"], libKB: libRSSKB(pid, e.lib), pssKB: roll["Pss"]}
		for tid, v := range after {
			hz := float64(v-before[pid][tid]) / secs // a thread born in the window counts from 0
			if tid == pid {
				w.nginxHz = hz
			} else {
				w.goHz += hz
				w.busiestGoHz = max(w.busiestGoHz, hz)
			}
		}
		ws = append(ws, w)
	}
	var q, plain idleAvg
	for _, w := range ws {
		if w.calling {
			q.add(w)
		} else {
			plain.add(w)
		}
		log.Printf("idle: pid %d calling=%v lib=%v RSS %.1f MB (private %.1f MB, PSS %.1f MB, library file %.1f MB), %d threads, wake-ups/s nginx %.2f, others %.2f (busiest %.2f)",
			w.pid, w.calling, w.loaded, float64(w.rssKB)/1024, float64(w.privKB)/1024, float64(w.pssKB)/1024, float64(w.libKB)/1024, w.threads, w.nginxHz, w.goHz, w.busiestGoHz)
	}
	if q.n == 0 || plain.n == 0 {
		return fmt.Errorf("idle: %d calling and %d plain workers", q.n, plain.n)
	}
	if p.holdIdle {
		log.Printf("holding: idle nginx, prefix %s, workers %v; Ctrl-C to end", n.dir, pids)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
	}
	// An idle dispatcher must still notice the worker exit at once
	// (Kong#6904): how long the old workers take to go after a reload.
	reload, err := reloadTime(n, pids)
	if err != nil {
		return err
	}
	const sec = "Idle worker (one call, then quiet)"
	t.add(row{section: sec, name: fmt.Sprintf("RSS per worker, %d workers each side", q.n),
		subject: fmt.Sprintf("%.1f MB", q.rss()), baseline: fmt.Sprintf("%.1f MB plain", plain.rss()),
		ratio: q.rss() - plain.rss(), ratioLabel: "extra MB", target: "≤ 10", met: q.rss()-plain.rss() <= 10})
	t.add(row{section: sec, name: "of that RSS: the library file's pages (shared by every worker, one copy in the page cache)",
		subject: fmt.Sprintf("%.1f MB", q.lib()), baseline: "—", noRatio: true})
	t.add(row{section: sec, name: "RSS per worker less the library file's pages",
		subject: fmt.Sprintf("%.1f MB", q.rss()-q.lib()), baseline: fmt.Sprintf("%.1f MB plain", plain.rss()-plain.lib()),
		ratio: q.rss() - q.lib() - (plain.rss() - plain.lib()), ratioLabel: "extra MB"})
	t.add(row{section: sec, name: "private memory per worker (smaps_rollup Private_*)",
		subject: fmt.Sprintf("%.1f MB", q.priv()), baseline: fmt.Sprintf("%.1f MB plain", plain.priv()),
		ratio: q.priv() - plain.priv(), ratioLabel: "extra MB"})
	t.add(row{section: sec, name: fmt.Sprintf("PSS per worker (shared pages split among their users, %d workers)", len(ws)),
		subject: fmt.Sprintf("%.1f MB", q.pss()), baseline: fmt.Sprintf("%.1f MB plain", plain.pss()),
		ratio: q.pss() - plain.pss(), ratioLabel: "extra MB"})
	t.add(row{section: sec, name: "threads per worker",
		subject: fmt.Sprintf("%.1f", q.thr()), baseline: fmt.Sprintf("%.1f plain", plain.thr()),
		ratio: q.thr() - plain.thr(), ratioLabel: "extra threads", target: "≤ 3", met: q.thr()-plain.thr() <= 3})
	qhz, phz := q.hz(), plain.hz()
	t.add(row{section: sec, name: fmt.Sprintf("wake-ups/s per worker over %.0f s (nginx thread + others)", secs),
		subject:  fmt.Sprintf("%.2f (%.2f + %.2f)", qhz, q.nginxHz/float64(q.n), q.goHz/float64(q.n)),
		baseline: fmt.Sprintf("%.2f plain", phz), ratio: qhz - phz, ratioLabel: "extra per s", target: "≤ 2", met: qhz-phz <= 2})
	t.add(row{section: sec, name: "plain workers with the library loaded",
		subject: fmt.Sprintf("%d of %d", plain.loaded, plain.n), baseline: "—", noRatio: true,
		target: "0", met: plain.loaded == 0})
	t.add(row{section: sec, name: "nginx -s reload: until the idle old workers are gone",
		subject: fmt.Sprintf("%.2f s", reload.Seconds()), baseline: "—", noRatio: true,
		target: "≤ 1 s", met: reload <= time.Second})
	return nil
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
	n, loaded, rssKB, threads int
	privKB, pssKB, libKB      int
	nginxHz, goHz             float64
}

func (a *idleAvg) add(w idleWorker) {
	a.n++
	a.rssKB += w.rssKB
	a.privKB += w.privKB
	a.pssKB += w.pssKB
	a.libKB += w.libKB
	a.threads += w.threads
	a.nginxHz += w.nginxHz
	a.goHz += w.goHz
	if w.loaded {
		a.loaded++
	}
}

func (a idleAvg) rss() float64  { return float64(a.rssKB) / 1024 / float64(a.n) }
func (a idleAvg) priv() float64 { return float64(a.privKB) / 1024 / float64(a.n) }
func (a idleAvg) pss() float64  { return float64(a.pssKB) / 1024 / float64(a.n) }
func (a idleAvg) lib() float64  { return float64(a.libKB) / 1024 / float64(a.n) }
func (a idleAvg) thr() float64  { return float64(a.threads) / float64(a.n) }
func (a idleAvg) hz() float64   { return (a.nginxHz + a.goHz) / float64(a.n) }
