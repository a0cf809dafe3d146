//go:build qrpctesthooks

package hostq

import "sync/atomic"

// wakerHook, when set, replaces what the waker does for a kick
// (TestWakerDeathFallsBack makes it panic). Only a build with the
// qrpctesthooks tag has it (make test passes the tag to go test; the
// library nginx loads is built without it).
var wakerHook atomic.Pointer[func(mask uint64)]

// wakerSignal is what the waker does for a kick: a wake byte to each VM
// of mask (bit i: VM i).
func wakerSignal(mask uint64) {
	if f := wakerHook.Load(); f != nil {
		(*f)(mask)
		return
	}
	builtin.signalVMs(mask)
}
