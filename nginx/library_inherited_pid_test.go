package nginx

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// TestLibraryInheritedRecordSamePid: TestLibraryInheritedRecord, where the
// worker of the nginx that inherited the record happens to have the pid
// that the record names: the worker that wrote it has exited, and its pid
// was given again (pids wrap: pid_max is 32768 here; or the new nginx runs
// in a pid namespace of its own, where pids start again from 1). The
// record is still another process's (its start time tells), and the
// worker must load the library, not refuse it as "another copy of the
// library runs in this process".
//
// The pid is made to match with a pid namespace whose ns_last_pid is set
// (root only).
func TestLibraryInheritedRecordSamePid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a pid namespace)")
	}
	code := `
                local qrpc = require "resty.ffi.qrpc"
                local ok, err = qrpc.init_worker()
                ngx.say(ok and "loaded" or ("error: " .. tostring(err)), "|", tostring(os.getenv("QRPC_LIBRARY")), "|", ngx.worker.pid())`
	// QRPC_TEST_BTRFS_LIBS="A B": two copies of the library that
	// /proc/self/maps shows with one device and inode (the first file of
	// two btrfs subvolumes): the first nginx loads A, the second B.
	var libA, libB string
	init := ""
	if v := os.Getenv("QRPC_TEST_BTRFS_LIBS"); v != "" {
		libA, libB, _ = strings.Cut(v, " ")
		init = fmt.Sprintf("        assert(require(\"resty.ffi.qrpc\").configure{ host = %q, lib = %q })", ng.Host(), libA)
	}
	first := startNginx(t, ngxConf{Workers: 1, EnvNames: []string{"QRPC_LIBRARY"}, Server: loc("/t", code),
		InitByLua: init, AllowErrors: []string{`another copy`}})
	st, body := first.get("/t")
	if st != 200 || !strings.HasPrefix(body, "loaded|") {
		t.Fatalf("first nginx: %d %q", st, body)
	}
	f := strings.Split(strings.TrimSpace(body), "|")
	rec := f[1]
	pid, _ := strconv.Atoi(strings.Fields(rec)[0])
	i := strings.Index(rec, " /")
	if i < 0 || pid == 0 {
		t.Fatalf("QRPC_LIBRARY %q", rec)
	}
	// the first worker's record, the path another file's that shows the
	// same device and inode (btrfs subvolumes)
	stale := rec[:i] + " /elsewhere/subvolume/libffi_qrpc.so"
	first.stop()
	if libA != "" {
		// the real record; the second nginx loads B
		stale = rec
		conf, err := os.ReadFile(first.conf)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(first.conf, []byte(strings.ReplaceAll(string(conf), libA, libB)), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The same configuration again (same prefix and port), in a pid
	// namespace where the next pid, the worker's, is the record's.
	n := &nginxProc{t: t, dir: first.dir, port: first.port, conf: first.conf, exited: make(chan struct{}),
		client: &http.Client{Timeout: 30 * time.Second}, allow: first.allow}
	_ = os.Remove(filepath.Join(n.dir, "error.log"))
	// A chroot or a container may not let the namespace be set up (/ is
	// not a mount point there): the test is skipped, not failed.
	script := fmt.Sprintf("{ mount --make-rprivate / && mount -t proc proc /proc && echo %d > /proc/sys/kernel/ns_last_pid; } || { echo "+noNS+"; exit 1; }; exec %s -p %s/ -c %s -e %s",
		pid-1, nginxBin, n.dir, n.conf, filepath.Join(n.dir, "error.log"))
	n.cmd = exec.Command("/bin/sh", "-c", script)
	n.cmd.Env = ng.Environ(nil, "QRPC_LIBRARY="+stale)
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(n.dir, "stdout2.log"))
	if err != nil {
		t.Fatal(err)
	}
	n.cmd.Stdout, n.cmd.Stderr = out, out
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = n.cmd.Wait(); _ = out.Close(); close(n.exited) }()
	t.Cleanup(n.stop)
	if !testwait.For(15*time.Second, func() bool {
		select {
		case <-n.exited:
			if out := n.readFile("stdout2.log"); strings.Contains(out, noNS) {
				t.Skipf("no pid namespace with its own /proc here:\n%s", out)
			}
			t.Fatalf("nginx exited at start:\n%s\n%s", n.readFile("stdout2.log"), n.errorLog())
		default:
		}
		c, err := net.DialTimeout("tcp", n.addr(), 200*time.Millisecond)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}) {
		t.Fatalf("nginx did not start:\n%s\n%s", n.readFile("stdout2.log"), n.errorLog())
	}
	st, body = n.get("/t")
	f = strings.Split(strings.TrimSpace(body), "|")
	if len(f) < 3 || f[2] != strconv.Itoa(pid) {
		t.Skipf("the worker's pid is not the record's (%d): %q", pid, body)
	}
	if st != 200 || !strings.HasPrefix(body, "loaded|") {
		t.Fatalf("an nginx started with another process's record %q, its worker's pid the record's: %d %q", stale, st, body)
	}
}

// noNS is what the namespace's set-up prints when it cannot be made.
const noNS = "qrpc-test: cannot set up the pid namespace"
