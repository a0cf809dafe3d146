// Package demo_test runs the scripts behind `make demo` / `make demo-stop`
// the way a user does, on random ports and in a temporary run directory
// (so a demo the user has running is left alone). The up script checks
// every curl answer and error.log itself and exits non-zero on a mismatch.
package demo_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

func TestDemoUpAndDown(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the library and starts nginx")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// nginx workers drop to www-data/nobody when the test runs as root:
	// the library they load lives here, so the temp dirs are opened up.
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The nginx QRPC_NGINX names, as in the other suites; the script gets
	// its path and derives what it needs from the binary itself.
	ng, err := ngxtest.Find()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nginx: %s", ng)
	// The library and server make test built (QRPC_TEST_LIB, QRPC_TEST_DEMO),
	// copied where the workers can read them, or built here.
	lib := filepath.Join(dir, "libffi_qrpc.so")
	bin := filepath.Join(dir, "qrpc-demo")
	if p := os.Getenv("QRPC_TEST_LIB"); p != "" {
		copyFile(t, p, lib)
	} else {
		goBuild(t, root, "-buildmode=c-shared", "-o", lib, "./ffi")
	}
	copyFile(t, ngxtest.DemoServer(t, root), bin)

	base := []string{
		"QRPC_DEMO_RUN=" + filepath.Join(dir, "run"),
		"QRPC_DEMO_BIN=" + bin,
		"QRPC_DEMO_LIB=" + lib,
	}
	// The nginx the suites run (QRPC_NGINX), with the environment its
	// flavour needs (lua-resty-ffi: LD_LIBRARY_PATH).
	env := ng.Environ(nil)
	out := upAndDown(t, ng, root, dir, withEnv(env, append(base, ngxtest.EnvNginx+"="+ng.Bin)...))
	m := regexp.MustCompile(`==> starting nginx \((/\S+), http://`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("up does not say which nginx it started:\n%s", out)
	}
	nginx := m[1]
	checkReadmeTranscript(t, root, filepath.Join(dir, "run"), out)

	// The same binary by path, in the variable and in the older NGINX,
	// which nginx itself reads (inherited sockets): given a path there,
	// an nginx that inherits it logs "invalid socket number" and stays in
	// the foreground, so up would never return.
	for _, tc := range []struct{ name, kv string }{
		{"QRPC_NGINX_path", "QRPC_NGINX=" + nginx},
		{"legacy_NGINX_path", "NGINX=" + nginx},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := upAndDown(t, ng, root, dir, withEnv(withoutEnv(env, "QRPC_NGINX", "NGINX"), append(base, tc.kv)...))
			if !strings.Contains(out, "==> starting nginx ("+nginx+",") {
				t.Errorf("up with %s did not start %s:\n%s", tc.kv, nginx, out)
			}
		})
	}
}

// upAndDown runs demo/scripts/up and down with env as a user runs `make
// demo` and `make demo-stop`, checks the tour's output and that down
// stops both processes, and returns up's output.
func upAndDown(t *testing.T, ng *ngxtest.Nginx, root, dir string, env []string) string {
	t.Helper()
	script := func(name string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(root, "demo", "scripts", name))
		cmd.Dir = root
		cmd.Env = env
		// An nginx left in the foreground keeps the output pipe open
		// after the script is killed: stop waiting for it.
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { _, _ = script("down") })

	// Fresh ports for every run, from below the ephemeral range: with
	// the kernel's own pick (port 0) a QUIC client of a suite running
	// beside this one took the demo's UDP port between two runs in CI.
	env = withEnv(env,
		fmt.Sprintf("QRPC_DEMO_HTTP=127.0.0.1:%d", ngxtest.FreePort(t)),
		fmt.Sprintf("QRPC_DEMO_ADDR=127.0.0.1:%d", ngxtest.FreePort(t)),
		fmt.Sprintf("QRPC_DEMO_MTLS_ADDR=127.0.0.1:%d", ngxtest.FreePort(t)))

	run := filepath.Join(dir, "run")
	out, err := script("up")
	if err != nil {
		logs, _ := os.ReadFile(filepath.Join(run, "error.log"))
		t.Fatalf("demo/scripts/up: %v\n%s\nerror.log:\n%s", err, out, logs)
	}
	for _, want := range []string{"Hello nginx!", "error: timeout", "Hello mTLS client!", `"notify":2`,
		`{"message":"Hello pb!"}`, `{"message":"Hello json!"}`, "bad message: demo.HelloRequest: nmae: unknown field",
		"==> the demo is running"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}

	// Every worker that loaded the library did so on this nginx's host.
	logs, _ := os.ReadFile(filepath.Join(run, "error.log"))
	if want := "(host " + ng.Host() + ")"; !strings.Contains(string(logs), want) {
		t.Errorf("error.log has no %q:\n%s", want, logs)
	}

	pids := map[string]int{}
	for _, f := range []string{"nginx.pid", "server.pid"} {
		pids[f] = readPid(t, filepath.Join(run, f))
	}
	downOut, err := script("down")
	if err != nil {
		t.Fatalf("demo/scripts/down: %v\n%s", err, downOut)
	}
	for f, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("%s: process %d still alive after down", f, pid)
		}
		if _, err := os.Stat(filepath.Join(run, f)); err == nil {
			t.Errorf("%s left behind", f)
		}
	}
	return out
}

// withEnv returns env with the K=V pairs set (replacing earlier values).
func withEnv(env []string, kvs ...string) []string {
	for _, kv := range kvs {
		k, _, _ := strings.Cut(kv, "=")
		env = append(withoutEnv(env, k), kv)
	}
	return env
}

func withoutEnv(env []string, keys ...string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(keys, k) {
			out = append(out, kv)
		}
	}
	return out
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func goBuild(t *testing.T, root string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build", "-trimpath"}, args...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, out)
	}
}

func readPid(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		t.Fatalf("%s: bad pid %q", file, b)
	}
	return pid
}

// checkReadmeTranscript compares the transcript README.md shows between
// its demo-output markers with what the demo printed. Only what differs
// from machine to machine or run to run is masked: the addresses (the
// README shows the defaults), the nginx binary, the run directory, and the
// counters of the worker that answers /stats.
func checkReadmeTranscript(t *testing.T, root, run, out string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- demo-output:begin -->\n```\n", "```\n<!-- demo-output:end -->"
	i, j := strings.Index(string(readme), begin), strings.Index(string(readme), end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no transcript between %q and %q", strings.TrimSpace(begin), end)
	}
	want := string(readme[i+len(begin) : j])

	m := regexp.MustCompile(`==> starting the demo qrpc server \(udp (\S+) TLS, udp (\S+) mTLS\)`).FindStringSubmatch(out)
	n := regexp.MustCompile(`==> starting nginx \((/\S+), http://(\S+)\)`).FindStringSubmatch(out)
	if m == nil || n == nil {
		t.Fatalf("the demo's output lacks its starting lines:\n%s", out)
	}
	got := out[strings.Index(out, m[0]):]
	// Printed only where the workers' user cannot read the checkout (the
	// README says so under the transcript).
	got = regexp.MustCompile(`(?m)^note: \S+ cannot read .*; nginx workers run as root for this demo\n`).ReplaceAllString(got, "")
	got = strings.NewReplacer(
		run, "/path/to/lua-resty-ffi-qrpc/demo/run",
		n[1]+",", "/usr/sbin/nginx,",
		m[1], "127.0.0.1:8443",
		m[2], "127.0.0.1:8444",
		n[2], "127.0.0.1:8080",
	).Replace(got)
	// The demo runs two workers: the counters of the one that answers
	// /stats depend on how the calls were spread.
	worker := regexp.MustCompile(`(client \(this worker\): )calls=\d+ dropped=\d+ events=\d+`)
	mask := func(s string) string { return worker.ReplaceAllString(s, "${1}calls=N dropped=N events=N") }
	wl, gl := strings.Split(mask(want), "\n"), strings.Split(mask(got), "\n")
	for k := 0; k < len(wl) || k < len(gl); k++ {
		var w, g string
		if k < len(wl) {
			w = wl[k]
		}
		if k < len(gl) {
			g = gl[k]
		}
		if w != g {
			t.Errorf("README.md's demo transcript differs from what the demo prints, line %d:\nREADME: %q\ndemo:   %q\n(the demo printed, masked:)\n%s", k+1, w, g, got)
			return
		}
	}
}
