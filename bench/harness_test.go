package main

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
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
