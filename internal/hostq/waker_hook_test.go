//go:build qrpctesthooks

package hostq

import (
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// A panic of the waker goroutine between taking the VMs it owes a wake
// byte and writing them: the byte is written all the same (the
// dispatcher would otherwise sleep with a completion queued), the waker
// goes on serving kicks, and the panic is counted.
func TestWakerPanicWritesItsBytes(t *testing.T) {
	d := openBuiltin(t)
	before := panics("waker")
	safego.Arm("waker", 1)
	t.Cleanup(func() { safego.Arm("waker", 0) })

	builtin.Complete(rt.Message(bridge.ErrGeneric, "first", 1))
	if n := d.pump(5 * time.Second); n < 1 {
		t.Fatal("no wake byte for the completion whose waker panicked")
	}
	if c, ok := d.got[1]; !ok || text(c) != "first" {
		t.Fatalf("first completion: %v %q", ok, text(c))
	}
	if safego.Armed("waker") != 0 || panics("waker") != before+1 {
		t.Fatalf("waker panics counted %d, want %d (still armed: %d)", panics("waker"), before+1, safego.Armed("waker"))
	}
	if builtin.submitq.kick.Load() == nil {
		t.Fatal("the waker stepped aside after one panic")
	}
	builtin.Complete(rt.Message(bridge.ErrGeneric, "second", 2))
	if n := d.pump(5 * time.Second); n < 1 {
		t.Fatal("no wake byte for a completion after the waker's panic")
	}
	if c, ok := d.got[2]; !ok || text(c) != "second" {
		t.Fatalf("second completion: %v %q", ok, text(c))
	}
	for _, id := range []uint64{1, 2} {
		c := d.got[id]
		rt.Free(&c)
	}
}

// panics is safego's count of recovered panics of where.
func panics(where string) uint64 {
	for _, c := range safego.Counts() {
		if c.Where == where {
			return c.N
		}
	}
	return 0
}
