package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// The context-switch figures read every thread's status file; a count
// that did not move across a sleep would make every row 0.
func TestProcCSW(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid := os.Getpid()
	before, err := procCSW(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Each sleep of the locked thread switches it out at least once.
	for i := 0; i < 5; i++ {
		time.Sleep(2 * time.Millisecond) // the subject: each sleep switches the thread out
	}
	after, err := procCSW(pid)
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 5 {
		t.Fatalf("%d context switches across 5 sleeps, want >= 5", after-before)
	}
	if _, err := procCSW(1 << 30); err == nil {
		t.Fatal("no error for a pid that does not exist")
	}
}

func TestCtxtSwitches(t *testing.T) {
	st := "Name:\tnginx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t30\n"
	if n, err := ctxtSwitches(st); err != nil || n != 42 {
		t.Fatalf("got %d, %v; want 42", n, err)
	}
	if _, err := ctxtSwitches("voluntary_ctxt_switches:\t12\n"); err == nil {
		t.Fatal("no error with one of the two lines")
	}
	if _, err := ctxtSwitches("voluntary_ctxt_switches:\tx\nnonvoluntary_ctxt_switches:\t1\n"); err == nil {
		t.Fatal("no error for a bad number")
	}
}

func TestParseChild(t *testing.T) {
	st, err := parseChild("SECS 0.5 CPU 0.25 CSW 3000\n")
	if err != nil {
		t.Fatal(err)
	}
	if st.d != 500*time.Millisecond || st.cpu != 250*time.Millisecond || st.csw != 3000 {
		t.Fatalf("got %+v", st)
	}
	// the ping-pong child prints only its time
	if st, err := parseChild("SECS 1.5\n"); err != nil || st.d != 1500*time.Millisecond || st.csw != 0 {
		t.Fatalf("SECS only: %+v, %v", st, err)
	}
	for _, bad := range []string{"", "CPU 1 SECS 2", "SECS x", "SECS 1 FOO 2"} {
		if _, err := parseChild(bad); err == nil || !strings.Contains(err.Error(), "child answered") {
			t.Fatalf("%q: %v, want an error", bad, err)
		}
	}
}

// A measuring child that never answers (a server that stopped) must not
// hang the bench: once childLimit has passed its whole process group is
// killed, a grandchild (what perf record forks) included, and the run
// gets an error.
func TestChildBounded(t *testing.T) {
	defer func(l time.Duration) { childLimit = l }(childLimit)
	childLimit = 300 * time.Millisecond
	// the shell forks a sleeper and waits: both must go
	cmd := exec.Command("sh", "-c", "sleep 600 & echo $!; wait")
	began := time.Now()
	out, err := outputBounded(cmd)
	if err == nil || !strings.Contains(err.Error(), "killed after") {
		t.Fatalf("err = %v, want killed after %v", err, childLimit)
	}
	if d := time.Since(began); d > time.Minute {
		t.Fatalf("returned after %v", d)
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(string(out)))
	if perr != nil {
		t.Fatalf("the shell printed %q", out)
	}
	// killed with its group (a zombie until whoever adopted it reaps it)
	waitEnded(t, "the grandchild", pid)
	if out, err := outputBounded(exec.Command("echo", "SECS 1")); err != nil || string(out) != "SECS 1\n" {
		t.Fatalf("a child that answers: %q, %v", out, err)
	}
}

// A measuring client under a wrapper (perf record forks it) ends with the
// wrapper, which the bench's Pdeathsig kills when the bench ends: the
// shell here stands for perf, this test binary for the client.
func TestClientDiesWithWrapper(t *testing.T) {
	if os.Getenv("BENCH_TEST_WRAPPED_CLIENT") == "1" {
		if err := dieWithParent(); err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		fmt.Println("ready")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	cmd := exec.Command("sh", "-c", `"$0" -test.run='^TestClientDiesWithWrapper$' & echo $!; wait`, os.Args[0])
	cmd.Env = append(os.Environ(), "BENCH_TEST_WRAPPED_CLIENT=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	line, _ := r.ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if perr != nil {
		t.Fatalf("the shell printed %q", line)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGKILL) }()
	if line, _ := r.ReadString('\n'); line != "ready\n" {
		t.Fatalf("the client printed %q", line)
	}
	_ = cmd.Process.Kill() // the wrapper dies, as the bench's Pdeathsig kills it
	_ = cmd.Wait()
	waitEnded(t, "the client, after its wrapper ended,", pid)
}

// waitEnded waits for process pid to end (a zombie until whoever adopted
// it reaps it counts as ended).
func waitEnded(t *testing.T, what string, pid int) {
	t.Helper()
	testwait.Until(t, what+" "+strconv.Itoa(pid)+" to end", 5*time.Second, func() bool {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err != nil || strings.Contains(string(st), ") Z ")
	})
}
