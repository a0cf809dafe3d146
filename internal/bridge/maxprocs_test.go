package bridge

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDefaultGOMAXPROCSPinned: a worker whose Go runtime started on one
// CPU (worker_cpu_affinity) keeps its 1 P when its affinity widens. Go
// re-sizes GOMAXPROCS to the CPUs it sees about once a second unless
// runtime.GOMAXPROCS was called, and 1 was already Go's own default
// there. The test runs in a child process started on one CPU, before
// the testing package runs: that calls runtime.GOMAXPROCS itself.
func TestDefaultGOMAXPROCSPinned(t *testing.T) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Skip("sched_getaffinity:", err)
	}
	if all.Count() < 2 {
		t.Skip("needs 2 CPUs")
	}
	first := -1
	for c := 0; first < 0 && c < 1024; c++ {
		if all.IsSet(c) {
			first = c
		}
	}
	// A child inherits the affinity of the thread that forks it.
	runtime.LockOSThread()
	var one unix.CPUSet
	one.Set(first)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer runtime.UnlockOSThread()
	defer unix.SchedSetaffinity(0, &all)
	// Go ignores a GOMAXPROCS it cannot read: the library's default holds.
	for _, env := range []string{"", "0", "abc"} {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), pinnedChildEnv+"=1", "GOMAXPROCS="+env)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "kept 1 P" {
			t.Errorf("GOMAXPROCS=%q: child: %v\n%s", env, err, out)
		}
	}
}

const pinnedChildEnv = "QRPC_BRIDGE_PINNED_CHILD"

func init() {
	if os.Getenv(pinnedChildEnv) != "1" {
		return
	}
	if err := pinnedChild(); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("kept 1 P")
	os.Exit(0)
}

func pinnedChild() error {
	if n := runtime.GOMAXPROCS(0); n != 1 || runtime.NumCPU() != 1 {
		return fmt.Errorf("started on %d CPUs, Go's default %d Ps: not on one CPU", runtime.NumCPU(), n)
	}
	if n := DefaultGOMAXPROCS(os.LookupEnv); n != 1 {
		return fmt.Errorf("default %d, want 1", n)
	}
	// Widen every thread's affinity (threads started later inherit it).
	var wide unix.CPUSet
	for c := 0; c < 1024; c++ {
		wide.Set(c)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if err := unix.SchedSetaffinity(tid, &wide); err != nil {
			return fmt.Errorf("widen thread %d: %w", tid, err)
		}
	}
	// Go looks at most once a second, from sysmon, which the timers of
	// this loop keep running; three of its looks.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		time.Sleep(time.Millisecond)
		if n := runtime.GOMAXPROCS(0); n != 1 {
			return fmt.Errorf("affinity widened: GOMAXPROCS became %d, want the default 1 kept", n)
		}
	}
	return nil
}
