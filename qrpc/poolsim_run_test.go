package qrpc

import (
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

// runSeeds runs the simulation for each seed, steps events each, and
// fails with the seed's replay command.
func runSeeds(t *testing.T, seeds []uint64, steps int) {
	t.Helper()
	if *simSeed != 0 {
		seeds = []uint64{*simSeed}
	}
	if *simSteps != 0 {
		steps = *simSteps
	}
	began := time.Now()
	total := 0
	for _, seed := range seeds {
		w := simRun(t, seed, steps, true)
		total += w.events
		if w.failure != "" {
			t.Fatalf("seed %d failed after %d events: %s\nlast events:\n  %s\nreplay: %s",
				seed, w.events, w.failure, strings.Join(w.recent, "\n  "), w.replay(steps))
		}
		if len(seeds) <= 30 {
			t.Logf("seed %d: %d events, %d calls, trace %x", seed, w.events, len(w.calls), w.h.Sum64())
		}
	}
	el := time.Since(began)
	t.Logf("%d seeds, %d events in %v (%.0f events/s)", len(seeds), total, el.Round(time.Millisecond), float64(total)/el.Seconds())
}

func seedRange(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

// TestPoolSimulation runs the pool simulation (poolsim_test.go): 25
// seeds × 2,000 events, every invariant checked after every event. A
// failure prints the seed and the command that replays it.
func TestPoolSimulation(t *testing.T) {
	runSeeds(t, seedRange(1, 25), 2000)
}

// TestPoolSimulationLong: 200 more seeds × 10,000 events (make
// test-long).
func TestPoolSimulationLong(t *testing.T) {
	ngxtest.Long(t, "2,000,000 simulated events")
	runSeeds(t, seedRange(1000, 200), 10000)
}

// TestPoolSimulationReplays: a seed replays exactly (the same trace, event
// by event), and a run whose wall clock steps by up to an hour either way
// traces as one whose clock does not: no window is on the wall clock.
func TestPoolSimulationReplays(t *testing.T) {
	for _, seed := range []uint64{3, 7, 11, 19} {
		a := simRun(t, seed, 3000, true)
		b := simRun(t, seed, 3000, true)
		c := simRun(t, seed, 3000, false)
		if a.failure != "" {
			t.Fatalf("seed %d: %s", seed, a.failure)
		}
		if a.h.Sum64() != b.h.Sum64() {
			t.Fatalf("seed %d: two runs traced %x and %x", seed, a.h.Sum64(), b.h.Sum64())
		}
		if a.wall == 0 {
			t.Fatalf("seed %d: no wall clock step in the run", seed)
		}
		if a.h.Sum64() != c.h.Sum64() {
			t.Fatalf("seed %d: a run whose wall clock stepped (by %d s in all) traced %x, one whose clock did not %x", seed, a.wall, a.h.Sum64(), c.h.Sum64())
		}
	}
}
