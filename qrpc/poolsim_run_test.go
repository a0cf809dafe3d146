package qrpc

import (
	"testing"
	"time"
)

func TestPoolSimulation(t *testing.T) {
	seeds := []uint64{}
	for i := range 25 {
		seeds = append(seeds, uint64(i+1))
	}
	steps := 2000
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
			t.Fatalf("seed %d failed after %d events: %s\nlast events:\n%s\nreplay: %s", seed, w.events, w.failure, joinLines(w.recent), w.replay(steps))
		}
		t.Logf("seed %d: %d events, %d calls, trace %x", seed, w.events, len(w.calls), w.h.Sum64())
	}
	el := time.Since(began)
	t.Logf("%d seeds, %d events in %v (%.0f events/s)", len(seeds), total, el, float64(total)/el.Seconds())
}

func joinLines(l []string) string {
	s := ""
	for _, x := range l {
		s += "  " + x + "\n"
	}
	return s
}
