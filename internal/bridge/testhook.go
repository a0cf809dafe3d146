//go:build qrpctesthooks

package bridge

import "sync/atomic"

// testHook lets tests panic at chosen points ("submit", "complete") to
// check that the panic is recovered into an error. Only a build with the
// qrpctesthooks tag has it (make test passes the tag to go test; the
// library nginx loads is built without it).
var testHook atomic.Pointer[func(where string)]

// SetTestHook installs (nil: removes) the function that runs at the
// named points.
func SetTestHook(f func(where string)) {
	if f == nil {
		testHook.Store(nil)
		return
	}
	testHook.Store(&f)
}

func hook(where string) {
	if f := testHook.Load(); f != nil {
		(*f)(where)
	}
}
