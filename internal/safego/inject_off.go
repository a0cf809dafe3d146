//go:build !qrpctesthooks

package safego

// Inject marks a point where a test build (the qrpctesthooks tag,
// inject.go) can make a goroutine panic in the middle of its work; in
// this build it is nothing and compiles away.
func Inject(string) {}
