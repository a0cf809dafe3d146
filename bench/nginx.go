package main

// nginx started from bench/nginx.conf.tmpl, and the measurements it runs
// itself (bench/lua/bench.lua).

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"
)

// nginxOpts is how an nginx is started: worker count, GOMAXPROCS and
// GODEBUG in its environment ("" = the library's default) and
// worker_cpu_affinity ("" = none).
type nginxOpts struct {
	workers                       int
	gomaxprocs, godebug, affinity string
}

type nginx struct {
	bin  string   // the nginx binary
	env  []string // added to the environment
	dir  string
	tmpl *template.Template
	data map[string]any
	port int
}

func (n *nginx) args(extra ...string) []string {
	return append([]string{"-p", n.dir, "-c", filepath.Join(n.dir, "nginx.conf"), "-e", filepath.Join(n.dir, "error.log")}, extra...)
}

func (n *nginx) start(o nginxOpts) error {
	var err error
	if n.port, err = freePort(); err != nil {
		return err
	}
	n.data["Port"] = n.port
	n.data["Affinity"] = o.affinity
	n.data["Workers"] = max(o.workers, 1)
	f, err := os.Create(filepath.Join(n.dir, "nginx.conf"))
	if err != nil {
		return err
	}
	if err := n.tmpl.Execute(f, n.data); err != nil {
		f.Close()
		return err
	}
	f.Close()
	cmd := exec.Command(n.bin, n.args()...)
	cmd.Env = append(withoutEnv(withoutEnv(os.Environ(), "GOMAXPROCS"), "GODEBUG"), n.env...)
	if o.gomaxprocs != "" {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+o.gomaxprocs)
	}
	if o.godebug != "" {
		cmd.Env = append(cmd.Env, "GODEBUG="+o.godebug)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("start nginx: %v: %s", err, out)
	}
	for i := 0; i < 100; i++ {
		if _, err := n.get("/pid"); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nginx did not come up; error.log:\n%s", tail(filepath.Join(n.dir, "error.log")))
}

func (n *nginx) stop() {
	pid, err := os.ReadFile(filepath.Join(n.dir, "nginx.pid"))
	if err != nil {
		return
	}
	_ = exec.Command(n.bin, n.args("-s", "quit")...).Run()
	p := strings.TrimSpace(string(pid))
	for i := 0; i < 100; i++ {
		if _, err := os.Stat("/proc/" + p); err != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A worker stuck in a request keeps a graceful quit waiting for good
	// (a runaway bench loop once filled the disk with its log that way):
	// killed, workers first.
	log.Printf("nginx %s did not quit within 5 s; killing it", n.dir)
	if ws, err := n.workers(); err == nil {
		for _, w := range ws {
			_ = syscall.Kill(w, syscall.SIGKILL)
		}
	}
	if master, err := strconv.Atoi(p); err == nil {
		_ = syscall.Kill(master, syscall.SIGKILL)
	}
}

// workers are the pids of the master's children.
func (n *nginx) workers() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(n.dir, "nginx.pid"))
	if err != nil {
		return nil, err
	}
	master, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("nginx.pid: %w", err)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, d := range procs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(st)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(master) {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("nginx master %d has no workers", master)
	}
	return pids, nil
}

var httpc = &http.Client{Timeout: 10 * time.Minute}

func (n *nginx) get(path string) (string, error) {
	resp, err := httpc.Get(fmt.Sprintf("http://127.0.0.1:%d%s", n.port, path))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("GET %s: %d %s\nerror.log:\n%s", path, resp.StatusCode, b, tail(filepath.Join(n.dir, "error.log")))
	}
	return string(b), nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// warm sends n requests for path on n connections at once, so that with
// several workers (reuseport) each is likely to get some.
func (n *nginx) warm(path string, conns int) error {
	errs := make(chan error, conns)
	for i := 0; i < conns; i++ {
		go func() {
			// A client of its own: a new connection each.
			c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", n.port, path))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	var first error
	for i := 0; i < conns; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// measure is lua as a figure for pair.
func (n *nginx) measure(kind string, calls, size, c int) func() (time.Duration, error) {
	return func() (time.Duration, error) { return n.lua(kind, calls, size, c) }
}

// lua runs one measurement inside nginx (bench/lua/bench.lua) and returns
// its duration.
func (n *nginx) lua(kind string, calls, size, c int) (time.Duration, error) {
	return n.luaQuery(kind, fmt.Sprintf("kind=%s&n=%d&size=%d&c=%d", kind, calls, size, c))
}

// luaQuery is lua with the whole query string (kinds with more arguments).
func (n *nginx) luaQuery(kind, query string) (time.Duration, error) {
	st, err := n.luaStats(kind, query)
	return st.d, err
}

// stats is luaStats as a figure for pairStats.
func (n *nginx) stats(kind string, calls, size, c int) func() (callStats, error) {
	return func() (callStats, error) {
		return n.luaStats(kind, fmt.Sprintf("kind=%s&n=%d&size=%d&c=%d", kind, calls, size, c))
	}
}

// luaStats runs one measurement inside nginx and returns its duration
// with the worker's CPU time and context switches during it.
func (n *nginx) luaStats(kind, query string) (callStats, error) {
	body, err := n.get("/bench?" + query)
	if err != nil {
		return callStats{}, err
	}
	return n.parseStats(kind, body)
}

// benchAnswer is the JSON answer of a measurement run inside nginx.
type benchAnswer struct {
	Secs   float64 `json:"secs"`
	Calls  int     `json:"calls"`
	Errors int     `json:"errors"`
	CPU    float64 `json:"cpu"`
	CSW    int64   `json:"csw"`
}

// parseStats reads a measurement's answer; a failed call fails it.
func (n *nginx) parseStats(kind, body string) (callStats, error) {
	var r benchAnswer
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return callStats{}, fmt.Errorf("bad bench answer %q: %w", body, err)
	}
	if r.Calls < 1 {
		return callStats{}, fmt.Errorf("bench answer %q: no calls", body)
	}
	if r.Errors > 0 {
		return callStats{}, fmt.Errorf("%s: %d of %d calls failed; error.log:\n%s", kind, r.Errors, r.Calls, tail(filepath.Join(n.dir, "error.log")))
	}
	return callStats{d: secs(r.Secs), cpu: secs(r.CPU), csw: r.CSW}, nil
}
