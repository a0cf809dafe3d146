//go:build linux && qrpctesthooks

package qrpc

import (
	"os/exec"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"time"
)

// TestWatchExitPanicContained: a panic in the watch's goroutine is
// recovered and counted; the process is not taken down and no exit is
// reported (the lease's end takes over).
func TestWatchExitPanicContained(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to watch: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	before := panicsOf("pool share watch")
	safego.Arm("pool share watch", 1)
	defer safego.Arm("pool share watch", 0)
	stop, exited := watchExit(cmd.Process.Pid, func() {})
	if stop == nil || exited {
		t.Skip("no pidfd here")
	}
	defer stop()
	testwait.Until(t, "the panic counted", 10*time.Second, func() bool { return panicsOf("pool share watch") == before+1 })
}

func panicsOf(where string) uint64 {
	for _, c := range safego.Counts() {
		if c.Where == where {
			return c.N
		}
	}
	return 0
}
