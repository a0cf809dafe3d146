package qrpc_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestPanicOnTimerKeepsProcess: a panic on a goroutine of the client, here
// in the Done of a call whose deadline passes (run by the connection's
// deadline timer, on time.AfterFunc's goroutine), is recovered: the
// process lives, the panic is reported once, and the connection serves
// the next call. Without the recovery it ends the process ("panic: ...
// (*qconn).expire ... created by time.goFunc"), as a user saw in nginx:
// the scenario runs in a child process, so that such an end is this
// test's failure and not the end of the test binary.
func TestPanicOnTimerKeepsProcess(t *testing.T) {
	if os.Getenv("QRPC_TEST_PANIC_CHILD") == "1" {
		panicOnTimer(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPanicOnTimerKeepsProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "QRPC_TEST_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestPanicOnTimerKeepsProcess") {
		t.Fatalf("the process did not come through a panic on the deadline timer (%v):\n%s", err, out)
	}
}

func panicOnTimer(t *testing.T) {
	var mu sync.Mutex
	var reports []string
	safego.SetReporter(func(where string, v any, stack []byte) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, where)
	})
	defer safego.SetReporter(nil)

	e := newEnv(t)
	c := e.dial(t, nil)
	defer e.unblock()
	_, err := c.Start(&qrpc.Call{Method: []byte("block"), Deadline: time.Now().Add(50 * time.Millisecond)},
		func(*qrpc.Response, error) { panic("a bug in the caller's Done") })
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "the timer's panic reported", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reports) > 0
	})
	mu.Lock()
	if len(reports) != 1 || reports[0] != "deadline timer" {
		t.Errorf("reports %q, want one of the deadline timer", reports)
	}
	mu.Unlock()
	if resp, err := unary(c, 5*time.Second, "echo", []byte("after")); err != nil || string(resp.Body) != "after" {
		t.Fatalf("the call after the panic: %v", err)
	}
	if n := c.Stats().InFlight; n != 0 {
		t.Fatalf("InFlight %d after the panic", n)
	}
}
