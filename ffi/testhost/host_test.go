// Package testhost runs host.c, a C stand-in for nginx, against
// libffi_qrpc.so and a real qrpc server: the lua-resty-ffi host through
// libffi_init and a pthread task queue, the built-in host through its
// exports and the unix-socket wake-up, and the signal dispositions nginx
// relies on. (host.c carries a "go:build ignore" line so that the Go tool
// does not take it for cgo source of this package.)
package testhost

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
)

// build compiles the library and the two flavours of the host into dir.
func build(t *testing.T, dir string) (lib, host, nosyms string) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed: the C host cannot be built")
	}
	lib = filepath.Join(dir, "libffi_qrpc.so")
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	run(t, exec.Command(goTool, "build", "-tags", "qrpctesthooks", "-buildmode=c-shared", "-o", lib, ".."))
	host = filepath.Join(dir, "host")
	nosyms = filepath.Join(dir, "host-nosyms")
	flags := []string{"-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I../../internal/hostq", "host.c"}
	// -rdynamic exports the ngx_http_lua_ffi_* functions, as nginx with
	// lua-resty-ffi does; without it they are invisible to dlsym.
	run(t, exec.Command(gcc, append(flags, "-rdynamic", "-o", host, "-ldl", "-lpthread")...))
	run(t, exec.Command(gcc, append(flags, "-o", nosyms, "-ldl", "-lpthread")...))
	return lib, host, nosyms
}

func run(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
}

func TestCHost(t *testing.T) {
	dir := t.TempDir()
	lib, host, nosyms := build(t, dir)

	srv := testsrv.Start(t, testsrv.Options{})
	other, err := certs.NewCA("some other ca")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	otherFile := filepath.Join(dir, "other.pem")
	if err := os.WriteFile(caFile, srv.CA.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(otherFile, other.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Join(dir, "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, host, lib, srv.Addr, caFile, otherFile, sockDir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("host stdout:\n%s", stdout.String())
	t.Logf("host stderr:\n%s", stderr.String())
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	out := stdout.String()
	if strings.Contains(out, "FAIL") || !strings.Contains(out, "done: 0 failure(s)") {
		t.Fatal("the C host reported failures")
	}
	// Count the checks so that a host cut short cannot pass.
	if n := strings.Count(out, "\nok "); n < 50 {
		t.Fatalf("only %d checks ran", n)
	}
	// With no built-in host open, Go's log lines go to stderr, shaped like
	// nginx's; the lua-resty-ffi host says when it stopped.
	if !strings.Contains(stderr.String(), "[notice]") || !strings.Contains(stderr.String(), "qrpc: lua-resty-ffi runtime stopped") {
		t.Fatal("no stop notice from the lua-resty-ffi host on stderr")
	}
	if n := srv.Events("ev"); n != 2 {
		t.Fatalf("server got %d events, want 2 (one per host)", n)
	}
	if entries, _ := os.ReadDir(sockDir); len(entries) != 0 {
		t.Fatalf("files left in the socket directory: %v", entries)
	}

	// The negative control: without the library's signal forwarders, a
	// SIGCHLD lands on a Go thread and the checks above fail.
	cmd = exec.CommandContext(ctx, host, "signals", lib)
	cmd.Env = append(os.Environ(), "QRPC_NO_SIGNAL_FORWARD=1")
	stdout.Reset()
	stderr.Reset()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("signals without forwarders:\n%s%s", stdout.String(), stderr.String())
	if err == nil || !strings.Contains(stdout.String(), "FAIL signals only") {
		t.Fatal("the signal checks passed without the forwarders: they do not test what they claim")
	}

	// In a process without lua-resty-ffi the library still loads and
	// libffi_init refuses with a reason.
	cmd = exec.CommandContext(ctx, nosyms, lib)
	stdout.Reset()
	stderr.Reset()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("nosyms stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	if err != nil {
		t.Fatalf("host-nosyms: %v", err)
	}
	if !strings.Contains(stderr.String(), "no symbol ngx_http_lua_ffi_task_poll") {
		t.Fatal("libffi_init did not log why it refused")
	}
}
