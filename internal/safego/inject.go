//go:build qrpctesthooks

package safego

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Injected is the value of a panic Inject raises.
type Injected struct{ Where string }

func (i Injected) Error() string { return "safego: panic injected in " + i.Where }

var (
	injMu    sync.Mutex
	injArmed = map[string]int{}
	injAny   atomic.Bool // some kind is armed: Inject's fast path
)

// Arm makes the next n Injects of where panic (n <= 0 disarms it). Only a
// build with the qrpctesthooks tag has it: the tests of the library's
// recovery (make test passes the tag; the nginx suite's hooks library,
// internal/ngxtest, is built with it; the library users load is not).
func Arm(where string, n int) {
	injMu.Lock()
	defer injMu.Unlock()
	if n <= 0 {
		delete(injArmed, where)
	} else {
		injArmed[where] = n
	}
	injAny.Store(len(injArmed) > 0)
}

// Armed is how many panics of where are still to come.
func Armed(where string) int {
	injMu.Lock()
	defer injMu.Unlock()
	return injArmed[where]
}

// Inject panics when where is armed (Arm), once per arming count. It
// marks a point in the middle of a goroutine's work (a reader with calls
// pending, a timer with calls due) where a panic must be survived.
func Inject(where string) {
	if !injAny.Load() {
		return
	}
	injMu.Lock()
	n := injArmed[where]
	if n <= 0 {
		injMu.Unlock()
		return
	}
	if n == 1 {
		delete(injArmed, where)
	} else {
		injArmed[where] = n - 1
	}
	injAny.Store(len(injArmed) > 0)
	injMu.Unlock()
	panic(Injected{Where: where})
}

// ArmedString renders the armed kinds, for a test's failure message.
func ArmedString() string {
	injMu.Lock()
	defer injMu.Unlock()
	return fmt.Sprint(injArmed)
}
