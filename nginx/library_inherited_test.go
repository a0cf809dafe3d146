package nginx

import (
	"fmt"
	"strings"
	"testing"
)

// TestLibraryInheritedRecord: a process started by a worker (os.execute,
// io.popen) inherits the worker's QRPC_LIBRARY, and an nginx started that
// way passes it to its workers with `env QRPC_LIBRARY;`. On btrfs that
// record can show the device and inode of the very file the new worker
// loads under another path (each subvolume numbers its first file 257,
// on one device). The new worker must take the record for what it is,
// another process's, and load the library.
func TestLibraryInheritedRecord(t *testing.T) {
	code := `
                local qrpc = require "resty.ffi.qrpc"
                local ok, err = qrpc.init_worker()
                ngx.say(ok and "loaded" or ("error: " .. tostring(err)), "|", tostring(os.getenv("QRPC_LIBRARY")))`
	first := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", code)})
	st, body := first.get("/t")
	if st != 200 || !strings.HasPrefix(body, "loaded|") {
		t.Fatalf("first nginx: %d %q", st, body)
	}
	rec := strings.TrimSpace(strings.TrimPrefix(body, "loaded|"))
	// the record, with the path of another file that shows the same
	// device and inode
	i := strings.Index(rec, " /")
	if i < 0 {
		t.Fatalf("QRPC_LIBRARY %q: no path", rec)
	}
	stale := rec[:i] + " /elsewhere/subvolume/libffi_qrpc.so"
	first.stop()

	second := startNginx(t, ngxConf{Workers: 1, Main: "env QRPC_LIBRARY;",
		ProcEnv: []string{"QRPC_LIBRARY=" + stale}, Server: loc("/t", code)})
	st, body = second.get("/t")
	if st != 200 || !strings.HasPrefix(body, "loaded|") {
		t.Fatalf("an nginx started with the first worker's record, its path another's (%q): %d %q", stale, st, body)
	}
	if got := strings.TrimSpace(strings.TrimPrefix(body, "loaded|")); got == stale {
		t.Errorf("QRPC_LIBRARY is still the inherited %q, want this worker's own record", got)
	}
	t.Log(fmt.Sprintf("inherited %q, now %q", stale, strings.TrimSpace(body)))
}
