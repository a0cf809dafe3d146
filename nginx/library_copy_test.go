package nginx

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLibraryCopyRefused: the http VM loads the library from one path and
// the stream VM is configured with a copy at another path (two
// lua_package_path trees, each with the library beside it, find two).
// Loading both would start a second Go runtime in the worker; the second
// VM gets a clear error instead, and the worker maps one copy.
func TestLibraryCopyRefused(t *testing.T) {
	requireStreamLua(t)
	dir, err := os.MkdirTemp("", "qrpc-copy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755) // the workers' user reads it
	cp := filepath.Join(dir, "libffi_qrpc.so")
	b, err := os.ReadFile(libPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	c := streamConf(1)
	c.StreamInitByLua = fmt.Sprintf(`        assert(require("resty.ffi.qrpc").configure{ lib = %q, socket_dir = ngx.config.prefix() .. "run" })`, cp)
	c.AllowErrors = []string{`another copy of the library`}
	n := startNginx(t, c)
	if got := httpAsk(t, n, "unary echo h"); got != "OK 0 h" {
		t.Fatalf("http: %q", got)
	}
	l, err := dialLines(n.streamPort, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	got, err := l.ask("unary echo s", 20*time.Second)
	if err != nil || !strings.Contains(got, "qrpc: cannot load "+cp+": this worker has another copy of the library loaded (") {
		t.Fatalf("stream VM with a copy of the library: %q %v, want the refusal", got, err)
	}
	for _, pid := range n.workerPIDs() {
		m, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, line := range strings.Split(string(m), "\n") {
			if f := strings.Fields(line); len(f) >= 6 && strings.HasSuffix(f[5], "libffi_qrpc.so") {
				seen[f[5]] = true
			}
		}
		if len(seen) != 1 {
			t.Errorf("worker %d maps %d copies of the library: %v", pid, len(seen), seen)
		}
	}
	if got := httpAsk(t, n, "unary echo h2"); got != "OK 0 h2" {
		t.Errorf("http after: %q", got)
	}
}
