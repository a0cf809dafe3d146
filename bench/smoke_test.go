package main

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

// The benchmark runs only when someone runs it: a change to the module
// that one of its Lua files or its nginx config still relies on (a
// function moved to another module) broke `make bench-update` unseen.
// A short run of the sections that need no tool beyond wrk (no perf,
// no other nginx flavour) must end well and report each of them.
func TestBenchQuickSmoke(t *testing.T) {
	ngxtest.Long(t, "a quick run of several bench sections")
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Skip("no nginx on PATH")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	figures := "ipc,unary,memory,metrics,pools"
	sections := []string{"**IPC alone", "**Unary over QUIC", "**Memory", "**Metrics recording", "**Pools:"}
	if _, err := exec.LookPath("wrk"); err == nil {
		figures += ",proto"
		sections = append(sections, "**Protobuf: demo.Profile")
	} else {
		t.Log("no wrk on PATH (.ci/run installs it): the protobuf section is left out")
	}
	// Not t.TempDir (mode 0700): nginx's workers, another user, load
	// the library the run builds under TMPDIR.
	dir, err := os.MkdirTemp("", "qrpc-bench-smoke-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, out := filepath.Join(dir, "bench"), filepath.Join(dir, "r.md")
	build := exec.Command("go", "build", "-o", bin, "./bench")
	build.Dir = root
	if log, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./bench: %v\n%s", err, log)
	}
	// No bound of its own (a quick run's length is the machine's): a
	// hung run is stopped before go test's -timeout would end this
	// process, with what it started, which would outlive a panicking
	// test: its process group (the servers), and the nginx masters,
	// which leave that group as they daemonise and are found by their
	// pid files under the run's TMPDIR.
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "-quick", "-only", figures, "-out", out)
	cmd.Dir = root
	cmd.Env = append(withoutEnv(withoutEnv(os.Environ(), "GOMAXPROCS"), "TMPDIR"), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		stopNginxUnder(tmp)
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	log, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./bench: %v\n%s", err, log)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range sections {
		if !strings.Contains(string(md), sec) {
			t.Errorf("the report has no section %q:\n%s", sec, md)
		}
	}
}

// stopNginxUnder asks every nginx master whose pid file lies under dir to
// stop (SIGTERM: it stops its workers too).
func stopNginxUnder(dir string) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "nginx.pid" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		return nil
	})
}
