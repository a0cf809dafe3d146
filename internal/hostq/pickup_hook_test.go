//go:build qrpctesthooks

package hostq

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
)

// TestPickupHandsBackWhatCameMeanwhile: a command queued while a pickup
// runs rings nobody (the queue is taken, so the push finds the submitter
// awake); the pickup ends by ringing the submitter for it. The pickup
// here runs a CANCEL, which completes nothing, so no wake byte and no
// second pickup follow: only that ring runs the echo.
func TestPickupHandsBackWhatCameMeanwhile(t *testing.T) {
	d := openBuiltin(t)
	s := &builtin.submitq
	t.Cleanup(func() { bridge.SetTestHook(nil) })
	waitSubmitterAsleep(t)
	var pushed atomic.Bool
	bridge.SetTestHook(func(where string) {
		if where == "submit" && pushed.CompareAndSwap(false, true) {
			if st := pushAsync(echoCmd(21)); st != bridge.StatusPending {
				t.Errorf("push during the pickup: %d", st)
			}
		}
	})
	armPickup()
	cancel := &bridge.CmdABI{Version: bridge.CmdVersion, Op: bridge.OpCancel, CallID: 20}
	if st := pushAsync(cancel); st != bridge.StatusOK {
		t.Fatalf("push cancel: %d", st)
	}
	s.mu.Lock()
	f := s.f
	s.mu.Unlock()
	s.pickup(f)
	if !pushed.Load() {
		t.Fatal("the pickup ran no command")
	}
	if c := d.wait(21, 10*time.Second); c.Status != bridge.StatusOK {
		t.Fatalf("echo queued during the pickup: %d %q", c.Status, text(c))
	}
}
