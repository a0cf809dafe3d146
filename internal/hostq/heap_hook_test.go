//go:build qrpctesthooks

package hostq

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// privateKB is this process's private memory (smaps_rollup Private_*).
func privateKB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps_rollup")
	if err != nil {
		t.Skip("no /proc/self/smaps_rollup:", err)
	}
	kb := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && strings.HasPrefix(f[0], "Private_") {
			n, _ := strconv.Atoi(f[1])
			kb += n
		}
	}
	return kb
}

// TestTrimmerGivesBackTheCHeap: blocks freed inside the C heap stay the
// process's private memory (free() returns only the arena's top); as it
// stops, the trimmer hands their pages back to the kernel, so that an
// idle worker does not keep what a burst of calls left in malloc's free
// lists.
func TestTrimmerGivesBackTheCHeap(t *testing.T) {
	d := openBuiltin(t)
	const n, size = 320, 64 << 10 // 20 MB, below malloc's mmap threshold
	pin := heapHole(n, size)
	if pin == nil {
		t.Fatal("malloc failed")
	}
	defer heapFree(pin)
	held := privateKB(t)
	stops := builtin.submitq.stops.Load()
	// A use wakes the trimmer; it stops again once the burst's blocks
	// are given back.
	echoBurst(t, d, 1000, 10, 4<<10)
	testwait.Until(t, "the trimmer to stop after the burst", 60*time.Second, func() bool {
		return builtin.submitq.stops.Load() > stops && trimmerIdle()
	})
	after := privateKB(t)
	t.Logf("private memory with %d kB freed in the C heap: %d kB; once the trimmer stopped: %d kB", n*size>>10, held, after)
	if held-after < n*size>>10/2 {
		t.Fatalf("the trimmer's stop gave back %d kB of the %d kB freed in the C heap (private %d kB, then %d kB)", held-after, n*size>>10, held, after)
	}
}
