// Package testwait is the suites' one bounded wait: a test that needs a
// state it can only poll for (a file, a port, a log line, a counter, a
// process gone) waits here instead of sleeping. The limit is a deadline
// for failure only, generous for a loaded machine, never a timing
// assertion: a quick event ends the wait at once. A test that must see
// nothing happen counts its own progress instead (docs/testing.md).
package testwait

import (
	"testing"
	"time"
)

// For polls cond until it holds or limit has passed, and reports whether
// it held, for a caller that reports the failure itself (with a log, say).
func For(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	// The poll interval starts at 1 ms and doubles up to 50 ms: a quick
	// event is seen at once, a slow one costs little CPU on a busy machine.
	step := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(step)
		step = min(2*step, 50*time.Millisecond)
	}
}

// Until polls cond until it holds; when limit passes first, it fails t
// with what (the state the test was waiting for).
func Until(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	if !For(limit, cond) {
		t.Fatalf("not within %v: %s", limit, what)
	}
}
