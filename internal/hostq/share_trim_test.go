package hostq

import (
	"bytes"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge/cmdtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// TestShareStepsKeepNothing: the steps of idle shared pools (lists of
// POOL_SHARE commands only) do not start the trimmer, so what they leave
// must not be kept for it: a worker with big pools (records of tens or
// hundreds of KB, each of its own size) would otherwise keep their command
// blocks, up to the submit cache's 8 MB, for as long as it stays idle.
func TestShareStepsKeepNothing(t *testing.T) {
	d := openBuiltin(t)
	echoBurst(t, d, 1, 4, 200<<10)
	testwait.Until(t, "the trimmer to stop", 60*time.Second, trimmerIdle)
	id := uint64(1000)
	step := func(size int) {
		rec := bytes.Repeat([]byte{1}, size)
		// a pool that is gone: Go answers the step with a failure
		c := &bridge.CmdABI{Version: bridge.CmdVersion, Op: bridge.OpPoolShare, CallID: id, Conn: 1 << 40}
		c.Opts, c.OptsLen = cmdtest.Ptr(rec)
		if st := pushAsync(c); st != bridge.StatusPending {
			t.Fatalf("step of %d bytes: %d", size, st)
		}
		got := d.wait(id, 20*time.Second)
		if got.Status != bridge.StatusShare || got.Code != bridge.ShareFailed {
			t.Fatalf("step of %d bytes: status %d code %d", size, got.Status, got.Code)
		}
		id++
	}
	for _, size := range []int{20 << 10, 50 << 10, 120 << 10, 300 << 10, 700 << 10, 3 << 10} {
		step(size)
	}
	step(100) // its submit frees the last one's block
	small := 0
	for c := 0; c < smallClasses; c++ {
		small += smallKept(c)
	}
	if n := submitqCached(); n != 0 || small != 0 || builtin.submitq.trimOn.Load() {
		t.Fatalf("idle shared-pool steps left %d big blocks and %d small ones kept (trimmer on: %v)",
			n, small, builtin.submitq.trimOn.Load())
	}
}
