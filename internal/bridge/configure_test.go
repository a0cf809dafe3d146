package bridge

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

func keepProcs(t *testing.T) {
	n := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(n) })
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
	if n := DefaultGOMAXPROCS(); n != 2 {
		t.Errorf("8 Ps, no GOMAXPROCS in the environment: default %d, want 2", n)
	}
	runtime.GOMAXPROCS(1) // a worker pinned to one CPU
	if n := DefaultGOMAXPROCS(); n != 1 {
		t.Errorf("1 P: default %d, want 1 (never raised)", n)
	}
	t.Setenv("GOMAXPROCS", "8")
	runtime.GOMAXPROCS(8)
	if n := DefaultGOMAXPROCS(); n != 8 {
		t.Errorf("GOMAXPROCS=8 in the environment: %d, want it kept", n)
	}
}
