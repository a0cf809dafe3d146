//go:build !qrpctesthooks

package hostq

// wakerSignal is what the waker does for a kick: a wake byte to each VM
// of mask (bit i: VM i). A build with the qrpctesthooks tag can replace
// it (waker_hook.go).
func wakerSignal(mask uint64) { builtin.signalVMs(mask) }
