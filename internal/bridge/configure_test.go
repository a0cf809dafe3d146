package bridge

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
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
	out, err := Configure([]byte("gomaxprocs=3\n"))
	if err != nil || string(out) != "gomaxprocs=3\n" || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("gomaxprocs=3: %q %v, in force %d", out, err, runtime.GOMAXPROCS(0))
	}
	// No lines: only the answer.
	if out, err = Configure(nil); err != nil || string(out) != "gomaxprocs=3\n" {
		t.Fatalf("no lines: %q %v", out, err)
	}
	for _, bad := range []string{"gomaxprocs=0", "gomaxprocs=1025", "gomaxprocs=x", "gomaxprocs", "procs=2"} {
		out, err := Configure([]byte(bad))
		if !errors.Is(err, ErrBadCommand) || out != nil || !strings.HasPrefix(err.Error(), "bad command: opts: ") {
			t.Errorf("%q: %q %v", bad, out, err)
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
	if _, err := Configure([]byte("gomaxprocs=2")); err != nil {
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
