package ngxtest

import "time"

// WaitFor polls cond until it holds or d has passed, and reports whether
// it held: the one place where the suites wait for an event they can only
// poll for (a file, a port, a log line, a counter, a process gone). The
// interval starts at 1 ms and doubles up to 50 ms, so a quick event is
// seen at once and a slow one costs little CPU on a loaded machine. It
// is a bounded wait for an event, never a pause: a caller that must see
// nothing happen counts progress instead (docs/testing.md).
func WaitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
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
