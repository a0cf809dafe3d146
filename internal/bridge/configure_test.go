package bridge

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
)

func keepProcs(t *testing.T) {
	n := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(n) })
}

func TestConfigureGOMAXPROCS(t *testing.T) {
	keepProcs(t)
	r := New(newGoMemory(t), nil)
	err := r.Configure(recs("gomaxprocs=3\n"))
	out := r.settings()
	if err != nil || recText(out) != "gomaxprocs=3\nmetrics=1\nsysmon="+SysmonMode()+"\n" || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("gomaxprocs=3: %q %v, in force %d", out, err, runtime.GOMAXPROCS(0))
	}
	// No lines: only the answer.
	if err = r.Configure(nil); err != nil || recText(r.settings()) != "gomaxprocs=3\nmetrics=1\nsysmon="+SysmonMode()+"\n" {
		t.Fatalf("no lines: %q %v", out, err)
	}
	for _, bad := range []string{"gomaxprocs=0", "gomaxprocs=1025", "gomaxprocs=x", "gomaxprocs", "procs=2"} {
		err := r.Configure(recs(bad))
		if !errors.Is(err, ErrBadCommand) || !strings.HasPrefix(err.Error(), "bad command: opts: ") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("a refused line changed GOMAXPROCS to %d", runtime.GOMAXPROCS(0))
	}
}

func TestDefaultGOMAXPROCS(t *testing.T) {
	keepProcs(t)
	t.Cleanup(func() { procsChosen.Store(false) })
	t.Setenv("GOMAXPROCS", "")
	procsChosen.Store(false)
	runtime.GOMAXPROCS(8)
	if n := DefaultGOMAXPROCS(os.LookupEnv); n != 1 {
		t.Errorf("8 Ps, no GOMAXPROCS in the environment: default %d, want 1 (built-in host)", n)
	}
	if n := RestyFFIGOMAXPROCS(); n != 2 {
		t.Errorf("8 Ps, then lua-resty-ffi: %d, want 2", n)
	}
	procsChosen.Store(false)
	runtime.GOMAXPROCS(1) // a worker pinned to one CPU
	if n := DefaultGOMAXPROCS(os.LookupEnv); n != 1 {
		t.Errorf("1 P: default %d, want 1", n)
	}
	if n := RestyFFIGOMAXPROCS(); n != 1 {
		t.Errorf("1 P, then lua-resty-ffi: %d, want 1 (never above Go's default)", n)
	}
	for _, env := range []string{"0", "-2", "abc"} {
		procsChosen.Store(false)
		t.Setenv("GOMAXPROCS", env)
		runtime.GOMAXPROCS(8) // Go ignored the variable
		if n := DefaultGOMAXPROCS(os.LookupEnv); n != 1 {
			t.Errorf("GOMAXPROCS=%s, which Go ignores: default %d, want 1", env, n)
		}
	}
	procsChosen.Store(false)
	t.Setenv("GOMAXPROCS", "8")
	runtime.GOMAXPROCS(8)
	if n := DefaultGOMAXPROCS(os.LookupEnv); n != 8 {
		t.Errorf("GOMAXPROCS=8 in the environment: %d, want it kept", n)
	}
	if n := RestyFFIGOMAXPROCS(); n != 8 {
		t.Errorf("GOMAXPROCS=8 in the environment, then lua-resty-ffi: %d, want it kept", n)
	}
	// The worker's environment decides, not the one Go started with.
	t.Setenv("GOMAXPROCS", "3")
	procsChosen.Store(false)
	runtime.GOMAXPROCS(3)
	only := func(v string) func(string) (string, bool) {
		return func(string) (string, bool) { return v, v != "" }
	}
	if n := DefaultGOMAXPROCS(only("")); n != 1 {
		t.Errorf("GOMAXPROCS=3 at start, none in the worker: %d, want the default 1", n)
	}
	procsChosen.Store(false)
	if n := DefaultGOMAXPROCS(only("2")); n != 2 || !procsChosen.Load() {
		t.Errorf("GOMAXPROCS=2 in the worker: %d (chosen %v), want 2", n, procsChosen.Load())
	}
	// configure{ gomaxprocs } before lua-resty-ffi's init: kept too.
	t.Setenv("GOMAXPROCS", "")
	procsChosen.Store(false)
	runtime.GOMAXPROCS(8)
	DefaultGOMAXPROCS(os.LookupEnv)
	r := New(newGoMemory(t), nil)
	if err := r.Configure(recs("gomaxprocs=3\n")); err != nil {
		t.Fatal(err)
	}
	if n := RestyFFIGOMAXPROCS(); n != 3 {
		t.Errorf("configured 3, then lua-resty-ffi: %d, want 3", n)
	}
}

// configure runs QRPC_OP_CONFIGURE and returns its answer, or fails.
func configure(t *testing.T, r *Runtime, opts string) string {
	t.Helper()
	out, msg := r.Query(&Command{Op: OpConfigure, Opts: recs(opts)})
	if out.Status != StatusOK {
		t.Fatalf("configure %q: %d %s", opts, out.Status, msg)
	}
	defer r.Free(&out)
	return recText([]byte(text(out)))
}

// samples is the metrics' sample lines (no comments) that mention server.
func samples(t *testing.T, r *Runtime, server string) []string {
	t.Helper()
	out, err := r.MetricsQuery("", nil)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") && strings.Contains(l, `server="`+server+`"`) {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestMetricsOff: with metrics=off the pools dialled afterwards record
// nothing (their calls, states and bytes show nowhere); switched on
// again, a new pool records its calls exactly, and the unrecorded pool
// still is not.
func TestMetricsOff(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	r := New(newGoMemory(t), nil)
	h := newTestHost(t, r, true)
	if got := configure(t, r, ""); got != "gomaxprocs="+procs()+"\nmetrics=1\nsysmon="+SysmonMode()+"\n" {
		t.Fatalf("default: %q", got)
	}
	if got := configure(t, r, "metrics=0\n"); got != "gomaxprocs="+procs()+"\nmetrics=0\nsysmon="+SysmonMode()+"\n" {
		t.Fatalf("off: %q", got)
	}
	off := h.connect(1, ts)
	id := uint64(10)
	call := func(conn uint64, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			id++
			h.submit(unary(conn, id, "echo", "x", 5000), StatusPending)
			if c := h.wait(id, 5*time.Second); c.Status != StatusOK {
				t.Fatalf("call: %d %q", c.Status, text(c))
			}
		}
	}
	call(off, 5)
	if got := samples(t, r, ts.Addr); len(got) != 0 {
		t.Fatalf("metrics off, yet recorded:\n%s", strings.Join(got, "\n"))
	}
	// The calls did happen: the connection's own counters saw them.
	if s, err := r.Stats(off, 0); err != nil || s.Calls != 5 {
		t.Fatalf("stats of the unrecorded connection: %+v %v", s, err)
	}

	if got := configure(t, r, "metrics=1"); got != "gomaxprocs="+procs()+"\nmetrics=1\nsysmon="+SysmonMode()+"\n" {
		t.Fatalf("on: %q", got)
	}
	on := h.connect(2, ts)
	call(on, 3)
	call(off, 4)
	want := `qrpc_client_calls_total{method="echo",server="` + ts.Addr + `",result="ok"} 3`
	got := samples(t, r, ts.Addr)
	if !strings.Contains(strings.Join(got, "\n")+"\n", want+"\n") {
		t.Fatalf("metrics on: want %s in\n%s", want, strings.Join(got, "\n"))
	}

	// Bad opts change nothing.
	for _, tc := range []struct{ opts, msg string }{
		{"metrics=2", "bad command: opts: metrics must be 0 or 1, got 2"},
		{"metrics=no", "bad command: opts: record 23: a number of 2 bytes"},
		{"metrics=0\ncolour=blue", "bad command: opts: unknown record key 65535"},
	} {
		out, msg := r.Query(&Command{Op: OpConfigure, Opts: recs(tc.opts)})
		if out.Status != ErrBadArg || msg != tc.msg || out.Data != nil {
			t.Errorf("%q: %d %q, want %q", tc.opts, out.Status, msg, tc.msg)
		}
	}
	if got := configure(t, r, ""); got != "gomaxprocs="+procs()+"\nmetrics=1\nsysmon="+SysmonMode()+"\n" {
		t.Fatalf("after bad opts: %q", got)
	}
}

func procs() string { return strconv.Itoa(runtime.GOMAXPROCS(0)) }

// TestSysmonMode: the last schedtrace in GODEBUG decides, as in the
// runtime's own parsing; only a positive one keeps sysmon lazy.
func TestSysmonMode(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"", "go"},
		{"madvdontneed=1", "go"},
		{"schedtrace=2147483647", "lazy"},
		{"madvdontneed=1,schedtrace=2147483647", "lazy"},
		{"schedtrace=2147483647,schedtrace=0", "go"},
		{"schedtrace=0,schedtrace=5", "lazy"},
		{"schedtrace=x", "go"},
		{"schedtrace=2147483648", "go"}, // out of int32: the runtime ignores it too
	} {
		t.Setenv("GODEBUG", c.env)
		if got := SysmonMode(); got != c.want {
			t.Errorf("GODEBUG=%q: %s, want %s", c.env, got, c.want)
		}
	}
}
