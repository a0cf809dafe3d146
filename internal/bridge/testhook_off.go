//go:build !qrpctesthooks

package bridge

// hook is the test hook's place (testhook.go): nothing in a production
// build.
func hook(string) {}
