package ngxtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// EnvLong names the variable that runs the long tests: soaks, stress and
// scenarios that last tens of seconds by design. make test-long sets it;
// make test leaves them out (docs/testing.md says what runs where).
const EnvLong = "QRPC_TEST_LONG"

// Long skips t unless EnvLong is 1; why says what makes it long.
func Long(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(EnvLong) != "1" {
		t.Skipf("long (%s): make test-long runs it", why)
	}
}

// EnvDemo names a prebuilt demo server (demo/qrpc-demo: make test builds
// it once and passes it, instead of each suite linking its own).
const EnvDemo = "QRPC_TEST_DEMO"

// DemoServer returns EnvDemo's binary, or builds ./demo/server from the
// repository at root into a directory of t's.
func DemoServer(t testing.TB, root string) string {
	t.Helper()
	if p := os.Getenv(EnvDemo); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", EnvDemo, err)
		}
		return p
	}
	bin := filepath.Join(t.TempDir(), "qrpc-demo")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./demo/server")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./demo/server: %v\n%s", err, out)
	}
	return bin
}
