//go:build linux

package qrpc

import (
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// TestWatchExit: watchExit hears a process's exit at once, says "exited"
// of one gone already, and its stop ends the wait without a call.
func TestWatchExit(t *testing.T) {
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "30")
		if err := cmd.Start(); err != nil {
			t.Skipf("no sleep to watch: %v", err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	cmd := start()
	var gone atomic.Int32
	stop, exited := watchExit(cmd.Process.Pid, func() { gone.Add(1) })
	if stop == nil || exited {
		t.Skipf("no pidfd here (stop %v, exited %v)", stop != nil, exited)
	}
	defer stop()
	time.Sleep(10 * time.Millisecond)
	if gone.Load() != 0 {
		t.Fatal("gone called while the process runs")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	testwait.Until(t, "the exit heard", 10*time.Second, func() bool { return gone.Load() == 1 })

	if _, exited := watchExit(cmd.Process.Pid, func() {}); !exited {
		t.Fatal("a process gone already: not exited")
	}

	other := start()
	var called atomic.Int32
	stop2, _ := watchExit(other.Process.Pid, func() { called.Add(1) })
	stop2()
	_ = other.Process.Kill()
	_ = other.Wait()
	time.Sleep(50 * time.Millisecond)
	if called.Load() != 0 {
		t.Fatal("gone called after stop")
	}
}
