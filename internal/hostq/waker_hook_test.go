//go:build qrpctesthooks

package hostq

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// Should the waker goroutine die (a panic in its write), completions
// still wake the dispatcher: pushes go back to writing the byte
// themselves.
func TestWakerDeathFallsBack(t *testing.T) {
	d := openBuiltin(t)
	var died atomic.Bool
	f := func(uint64) {
		died.Store(true)
		panic("injected")
	}
	wakerHook.Store(&f)
	t.Cleanup(func() { wakerHook.Store(nil) })

	builtin.Complete(rt.Message(bridge.ErrGeneric, "first", 1))
	testwait.Until(t, "the waker to die and step aside", 30*time.Second, func() bool { return died.Load() && builtin.submitq.kick.Load() == nil })
	d.pump(10 * time.Millisecond) // the first completion, whose byte died with the waker
	if _, ok := d.got[1]; !ok {
		t.Fatal("first completion not queued")
	}
	builtin.Complete(rt.Message(bridge.ErrGeneric, "second", 2))
	if n := d.pump(5 * time.Second); n < 1 {
		t.Fatal("no wake byte for a completion after the waker died")
	}
	if c, ok := d.got[2]; !ok || text(c) != "second" {
		t.Fatalf("second completion: %v %q", ok, text(c))
	}
	for _, id := range []uint64{1, 2} {
		c := d.got[id]
		rt.Free(&c)
	}
}
