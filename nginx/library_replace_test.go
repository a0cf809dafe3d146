package nginx

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLibraryReplacedThenReload: both subsystems configure one path; the
// http VM loads it; make install replaces the file (a new inode at that
// path); the stream VM's first call is refused (the worker runs the old
// file) with the advice to reload, not "load the same file in both
// subsystems", which it does; after nginx -s reload, the new workers load
// the new file in both VMs.
func TestLibraryReplacedThenReload(t *testing.T) {
	requireStreamLua(t)
	dir, err := os.MkdirTemp(filepath.Dir(libPath), "qrpc-inst-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	lib := filepath.Join(dir, "libffi_qrpc.so")
	install := func() {
		if b, err := exec.Command("install", "-m", "755", libPath, lib).CombinedOutput(); err != nil {
			t.Fatalf("install: %v %s", err, b)
		}
	}
	install()
	c := streamConf(1)
	c.InitByLua = libConfigure(lib, true)
	c.StreamInitByLua = libConfigure(lib, false)
	c.AllowErrors = []string{`another copy of the library`}
	n := libStart(t, c)
	install() // make install: a new file at the path
	got := streamAsk(t, n.streamPort, "unary echo s")
	t.Logf("stream VM after the file was replaced: %q", got)
	if !strings.HasPrefix(got, "ERR ") {
		t.Errorf("stream VM loaded the replaced file: %q", got)
	} else if !strings.Contains(got, "reload") {
		t.Errorf("stream VM's refusal does not tell to reload nginx: %q", got)
	}
	old := n.workerPIDs()
	n.signal("reload")
	// the old worker gone, the new one's stream VM loads the new file
	err = eventually(15*time.Second, func() error {
		for _, p := range old {
			if pidAlive(p) {
				return fmt.Errorf("old worker %d still alive", p)
			}
		}
		l, err := dialLines(n.streamPort, time.Second)
		if err != nil {
			return err
		}
		defer l.close()
		if got, err := l.ask("unary echo s2", 5*time.Second); got != "OK 0 s2" {
			return fmt.Errorf("stream VM after reload: %q %v", got, err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	if got := httpAsk(t, n, "unary echo h2"); got != "OK 0 h2" {
		t.Errorf("http after reload: %q", got)
	}
}
