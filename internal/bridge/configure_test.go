package bridge

import (
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
)

func keepProcs(t *testing.T) {
	n := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(n)
		procsFixed.Store(false)
	})
}

func TestConfigureGOMAXPROCS(t *testing.T) {
	keepProcs(t)
	r := New(newGoMemory(t), nil)
	err := r.Configure([]byte("gomaxprocs=3\n"))
	out := r.settings()
	if err != nil || string(out) != "gomaxprocs=3\nmetrics=on\n" || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("gomaxprocs=3: %q %v, in force %d", out, err, runtime.GOMAXPROCS(0))
	}
	// No lines: only the answer.
	if err = r.Configure(nil); err != nil || string(r.settings()) != "gomaxprocs=3\nmetrics=on\n" {
		t.Fatalf("no lines: %q %v", out, err)
	}
	for _, bad := range []string{"gomaxprocs=0", "gomaxprocs=1025", "gomaxprocs=x", "gomaxprocs", "procs=2"} {
		err := r.Configure([]byte(bad))
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
	t.Setenv("GOMAXPROCS", "")
	runtime.GOMAXPROCS(8)
	if n, adapt := DefaultGOMAXPROCS(); n != 2 || !adapt {
		t.Errorf("8 Ps, no GOMAXPROCS in the environment: default %d (adapting %v), want 2, adapting", n, adapt)
	}
	runtime.GOMAXPROCS(1) // a worker pinned to one CPU
	if n, adapt := DefaultGOMAXPROCS(); n != 1 || adapt {
		t.Errorf("1 P: default %d (adapting %v), want 1 (never raised), not adapting", n, adapt)
	}
	t.Setenv("GOMAXPROCS", "8")
	runtime.GOMAXPROCS(8)
	if n, adapt := DefaultGOMAXPROCS(); n != 8 || adapt {
		t.Errorf("GOMAXPROCS=8 in the environment: %d (adapting %v), want it kept, not adapting", n, adapt)
	}
}

// TestAutoGOMAXPROCS: 1 P while many calls are in flight as calls start,
// the default back when few are or when calls are rare; the user's
// configure{ gomaxprocs } ends the adapting.
func TestAutoGOMAXPROCS(t *testing.T) {
	keepProcs(t)
	runtime.GOMAXPROCS(2)
	r := New(newGoMemory(t), nil)
	a := &autoProcs{r: r, hi: 2}
	period := func(calls, meanInflight uint64) int {
		r.calls.Add(calls)
		r.concSum.Add(calls * meanInflight)
		a.tick()
		return runtime.GOMAXPROCS(0)
	}
	steps := []struct {
		calls, mean uint64
		want        int
	}{
		{1000, 1, 2},  // sequential: latency first
		{1000, 20, 1}, // wrk -c50-like
		{1000, 5, 1},  // between the thresholds: no change
		{1000, 2, 2},  // back to few in flight
		{1000, 8, 1},
		{50, 40, 2}, // rare calls, however concurrent
	}
	for i, s := range steps {
		if got := period(s.calls, s.mean); got != s.want {
			t.Fatalf("step %d (%d calls, %d in flight on average): GOMAXPROCS %d, want %d", i, s.calls, s.mean, got, s.want)
		}
	}
	if a.switches.Load() != 4 {
		t.Errorf("%d switches, want 4", a.switches.Load())
	}

	// The goroutine: adapts on its own, and stops for good once the user
	// sets GOMAXPROCS.
	stop := r.StartAutoGOMAXPROCS(2, 5*time.Millisecond)
	defer stop()
	feed := func(mean uint64) {
		r.calls.Add(1000)
		r.concSum.Add(1000 * mean)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.GOMAXPROCS(0) != 1 && time.Now().Before(deadline) {
		feed(30)
		time.Sleep(2 * time.Millisecond)
	}
	if runtime.GOMAXPROCS(0) != 1 {
		t.Fatal("the controller never went to 1 P under load")
	}
	if err := r.Configure([]byte("gomaxprocs=2")); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		feed(30)
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Fatalf("after configure{ gomaxprocs = 2 } the controller set %d", n)
	}
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stop did not return")
	}
}

// configure runs QRPC_OP_CONFIGURE and returns its answer, or fails.
func configure(t *testing.T, r *Runtime, opts string) string {
	t.Helper()
	out, msg := r.Query(&Command{Op: OpConfigure, Opts: []byte(opts)})
	if out.Status != StatusOK {
		t.Fatalf("configure %q: %d %s", opts, out.Status, msg)
	}
	defer r.Free(&out)
	return text(out)
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
	if got := configure(t, r, ""); got != "gomaxprocs="+procs()+"\nmetrics=on\n" {
		t.Fatalf("default: %q", got)
	}
	if got := configure(t, r, "metrics=off\n"); got != "gomaxprocs="+procs()+"\nmetrics=off\n" {
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

	if got := configure(t, r, "metrics=on"); got != "gomaxprocs="+procs()+"\nmetrics=on\n" {
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
		{"metrics=no", `bad command: opts: metrics must be on or off, got "no"`},
		{"metrics=off\ncolour=blue", `bad command: opts: unknown key "colour"`},
		{"metrics", `bad command: opts: "metrics" is not key=value`},
	} {
		out, msg := r.Query(&Command{Op: OpConfigure, Opts: []byte(tc.opts)})
		if out.Status != ErrBadArg || msg != tc.msg || out.Data != nil {
			t.Errorf("%q: %d %q, want %q", tc.opts, out.Status, msg, tc.msg)
		}
	}
	if got := configure(t, r, ""); got != "gomaxprocs="+procs()+"\nmetrics=on\n" {
		t.Fatalf("after bad opts: %q", got)
	}
}

func procs() string { return strconv.Itoa(runtime.GOMAXPROCS(0)) }
