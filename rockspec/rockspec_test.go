// Package rockspec_test checks that the rockspec and `make install` install
// a working module: `luarocks make` into a temporary tree (or `make install`
// under a temporary PREFIX), then a real nginx that loads the module and
// the library from there (and only from there) makes a qrpc call to a real
// server.
package rockspec_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

const rockspec = "rockspec/lua-resty-ffi-qrpc-0.1.0-1.rockspec"

// prepare is the start both tests share: the -short skip, the repository
// root, nginx, and a temp dir. Workers drop to nobody when the test runs
// as root: everything they read (the installed tree) must be reachable, so
// the temp dir is opened up.
func prepare(t *testing.T) (root string, nginx *ngxtest.Nginx, dir string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the library and starts nginx")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// The nginx QRPC_NGINX names, as in the nginx suite; a missing one
	// fails: these tests are the only check that the install works.
	nginx, err = ngxtest.Find()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nginx: %s", nginx)
	return root, nginx, worldReadableTempDir(t)
}

func TestLuarocksMakeThenNginx(t *testing.T) {
	root, nginx, dir := prepare(t)
	luarocks := lookPath(t, "luarocks", "install it: apt-get install luarocks")
	tree := filepath.Join(dir, "tree")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, luarocks, "make", "--tree", tree, rockspec)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("luarocks make: %v\n%s", err, out)
	}
	t.Logf("luarocks make:\n%s", out)

	luaFile := filepath.Join(tree, "share", "lua", "5.1", "resty", "ffi", "qrpc.lua")
	libFile := filepath.Join(tree, "lib", "lua", "5.1", "libffi_qrpc.so")
	for _, f := range append(luaModules(t, root, filepath.Join(tree, "share", "lua", "5.1")), libFile) {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("not installed by the rock: %v", err)
		}
	}
	list, err := exec.Command(luarocks, "--tree", tree, "list", "--porcelain").CombinedOutput()
	if err != nil || !bytes.Contains(list, []byte("lua-resty-ffi-qrpc\t0.1.0-1")) {
		t.Fatalf("luarocks list does not show the rock (err %v):\n%s", err, list)
	}
	checkHeader(t, rockHeader(t, luarocks, tree))

	srv := startServer(t)
	luaRoot := filepath.Join(tree, "share", "lua", "5.1")
	// The ways users point the module at the library: the lib option; a
	// lua_package_cpath into the tree; nothing at all (the module looks
	// beside its own tree).
	for _, tc := range []struct {
		name, cpath, configure string
	}{
		{"lib option", "", fmt.Sprintf("{ lib = %q }", libFile)},
		{"lua_package_cpath", filepath.Join(tree, "lib", "lua", "5.1", "?.so") + ";;", "{}"},
		{"default search", "", "{}"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			checkFromNginx(t, nginx, dir, srv, install{luaRoot: luaRoot, luaFile: luaFile, libFile: libFile, cpath: tc.cpath, configure: tc.configure})
		})
	}
}

// TestMakeInstallThenNginx checks `make install`'s layout the same way:
// PREFIX/share/lua/5.1 + PREFIX/lib, found without any hint; and DESTDIR.
func TestMakeInstallThenNginx(t *testing.T) {
	root, nginx, dir := prepare(t)
	prefix := filepath.Join(dir, "prefix")
	stage := filepath.Join(dir, "stage")

	makeInstall := func(args ...string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory", "install"}, args...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make install %v: %v\n%s", args, err, out)
		}
	}
	makeInstall("PREFIX=" + prefix)
	makeInstall("DESTDIR="+stage, "PREFIX=/opt/qrpc")

	luaRoot := filepath.Join(prefix, "share", "lua", "5.1")
	luaFile := filepath.Join(luaRoot, "resty", "ffi", "qrpc.lua")
	libFile := filepath.Join(prefix, "lib", "libffi_qrpc.so")
	want := append(luaModules(t, root, luaRoot), libFile, filepath.Join(stage, "opt", "qrpc", "lib", "libffi_qrpc.so"))
	want = append(want, luaModules(t, root, filepath.Join(stage, "opt", "qrpc", "share", "lua", "5.1"))...)
	for _, f := range want {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("not installed: %v", err)
		}
	}
	checkHeader(t, filepath.Join(prefix, "include", "qrpc.h"))
	checkHeader(t, filepath.Join(stage, "opt", "qrpc", "include", "qrpc.h"))
	checkFromNginx(t, nginx, dir, startServer(t), install{luaRoot: luaRoot, luaFile: luaFile, libFile: libFile, configure: "{}"})
}

// checkHeader checks that the C ABI was installed at path, as the
// checkout has it.
func checkHeader(t *testing.T, path string) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join("..", "internal", "hostq", "qrpc.h"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the C ABI is not installed: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from internal/hostq/qrpc.h", path)
	}
}

// rockHeader is where a rock installed in tree keeps the C ABI: include/
// in the rock's own directory.
func rockHeader(t *testing.T, luarocks, tree string) string {
	t.Helper()
	out, err := exec.Command(luarocks, "--tree", tree, "show", "--rock-dir", "lua-resty-ffi-qrpc").Output()
	if err != nil {
		t.Fatalf("luarocks show --rock-dir: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "include", "qrpc.h")
}

// luaModules lists where every Lua file of the checkout's module family
// (resty/ffi/qrpc.lua, resty/ffi/qrpc/*.lua and resty/ffi/qrpc/*/*.lua,
// e.g. the gateway's) must be under luaRoot.
func luaModules(t *testing.T, root, luaRoot string) []string {
	t.Helper()
	lua := filepath.Join(root, "lua")
	subs, err := filepath.Glob(filepath.Join(lua, "resty", "ffi", "qrpc", "*.lua"))
	if err != nil || len(subs) == 0 {
		t.Fatalf("no lua/resty/ffi/qrpc/*.lua in the checkout (%v)", err)
	}
	deeper, _ := filepath.Glob(filepath.Join(lua, "resty", "ffi", "qrpc", "*", "*.lua"))
	out := []string{filepath.Join(luaRoot, "resty", "ffi", "qrpc.lua")}
	for _, s := range append(subs, deeper...) {
		rel, err := filepath.Rel(lua, s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.Join(luaRoot, rel))
	}
	return out
}

// install says where an installation put things and how nginx finds them.
type install struct {
	luaRoot, luaFile, libFile string
	cpath, configure          string
}

// checkFromNginx starts an nginx whose module path is the installation's
// only, makes a unary call and an event through it, and checks which files
// were loaded.
func checkFromNginx(t *testing.T, nginx *ngxtest.Nginx, dir string, srv *testsrv.Server, in install) {
	t.Helper()
	ndir, err := os.MkdirTemp(dir, "nginx-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ndir, 0o755); err != nil {
		t.Fatal(err)
	}
	before := srv.Events("notify")
	n := startNginx(t, nginx, ndir, map[string]any{
		"LuaPath": nginx.PackagePath(in.luaRoot + "/?.lua"), "CPath": in.cpath, "Configure": in.configure, "Addr": srv.Addr, "CA": string(srv.CA.CertPEM),
	})
	body := n.get(t, "/t")
	want := fmt.Sprintf("module=%s\ngreet=0 Hello rock!\nevent=true\nlib=%s\nhost=%s\n", in.luaFile, in.libFile, nginx.Host())
	if body != want {
		t.Fatalf("GET /t:\n%s\nwant:\n%s\nerror.log:\n%s", body, want, n.errorLog())
	}
	// The event is one-way: wait for the server to count it.
	testwait.For(5*time.Second, func() bool { return srv.Events("notify") >= before+1 })
	if got := srv.Events("notify") - before; got != 1 {
		t.Fatalf("server counted %d notify events, want 1", got)
	}
	n.stop(t)
	if bad := ngxtest.Problems(n.errorLog(), nil); len(bad) > 0 {
		t.Fatalf("error.log has problems:\n%s", strings.Join(bad, "\n"))
	}
}

// lookPath fails rather than skips: these tests are the only check that
// the install works, so a missing tool must not pass for a green run.
func lookPath(t *testing.T, name, hint string) string {
	t.Helper()
	p, err := ngxtest.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found (%s)", name, hint)
	}
	return p
}

func worldReadableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startServer starts the qrpc server the nginx in these tests calls
// (greet and the notify event, see testsrv), quiet: nothing here reads its
// log.
func startServer(t *testing.T) *testsrv.Server {
	t.Helper()
	return testsrv.Start(t, testsrv.Options{Logger: slog.New(slog.DiscardHandler)})
}

// The module and the library come from the tree only: lua_package_path
// starts with it, and the location reports which file `require` found.
var confTmpl = template.Must(template.New("nginx.conf").Parse(`
{{.Main}}
{{.User}}
worker_processes 1;
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/error.log info;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path {{.Dir}}/tmp/body;
    proxy_temp_path       {{.Dir}}/tmp/proxy;
    fastcgi_temp_path     {{.Dir}}/tmp/fastcgi;
    uwsgi_temp_path       {{.Dir}}/tmp/uwsgi;
    scgi_temp_path        {{.Dir}}/tmp/scgi;
    lua_package_path "{{.LuaPath}}";
    {{if .CPath}}lua_package_cpath "{{.CPath}}";{{end}}

    init_by_lua_block {
        {{.HostInit}}
        require "resty.ffi.qrpc"
    }
    init_worker_by_lua_block {
        assert(require("resty.ffi.qrpc").configure{{.Configure}})
    }

    server {
        listen 127.0.0.1:{{.Port}};
        location = /t {
            content_by_lua_block {
                local qrpc = require "resty.ffi.qrpc"
                ngx.say("module=", package.searchpath("resty.ffi.qrpc", package.path))
                local conn, err = qrpc.connect("{{.Addr}}", {
                    server_name = "localhost",
                    ca = [==[{{.CA}}]==],
                    timeout = 5000,
                })
                if not conn then
                    ngx.say("connect failed: ", err)
                    return
                end
                local res, err = conn:unary("greet", "rock", { timeout = 5000 })
                if not res then
                    ngx.say("unary failed: ", err)
                    return
                end
                ngx.say("greet=", res.code, " ", res.body)
                ngx.say("event=", tostring((conn:event("notify", "x"))))
                ngx.say("lib=", qrpc.stats().lib)
                ngx.say("host=", qrpc.stats().host)
            }
        }
    }
}
`))

type nginxProc struct {
	ng        *ngxtest.Nginx
	dir, port string
}

func (n *nginxProc) args(extra ...string) []string {
	return append([]string{"-p", n.dir + "/", "-c", filepath.Join(n.dir, "nginx.conf"), "-e", filepath.Join(n.dir, "error.log")}, extra...)
}

func startNginx(t *testing.T, ng *ngxtest.Nginx, dir string, data map[string]any) *nginxProc {
	t.Helper()
	n := &nginxProc{ng: ng, dir: dir, port: strconv.Itoa(ngxtest.FreePort(t))}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	data["Dir"], data["Port"] = dir, n.port
	data["Main"], data["HostInit"] = ng.MainConf(), ng.InitLua()
	data["User"] = workerUser(t)
	var conf bytes.Buffer
	if err := confTmpl.Execute(&conf, data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), conf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := ng.Command(n.args()...).CombinedOutput(); err != nil {
		t.Fatalf("start nginx: %v\n%s\n%s", err, out, n.errorLog())
	}
	t.Cleanup(func() { n.stop(t) })
	if !testwait.For(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+n.port, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}) {
		t.Fatalf("nginx does not listen on %s:\n%s", n.port, n.errorLog())
	}
	return n
}

// workerUser names an unprivileged user and its group when nginx starts as
// root (Debian has no group "nobody", so the group must be given).
func workerUser(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		return ""
	}
	for _, name := range []string{"www-data", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		g, err := user.LookupGroupId(u.Gid)
		if err != nil {
			continue
		}
		return fmt.Sprintf("user %s %s;", u.Username, g.Name)
	}
	t.Fatal("no unprivileged user (www-data, nobody) for the nginx workers")
	return ""
}

func (n *nginxProc) get(t *testing.T, path string) string {
	t.Helper()
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + n.port + path)
	if err != nil {
		t.Fatalf("GET %s: %v\nerror.log:\n%s", path, err, n.errorLog())
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d\n%s\nerror.log:\n%s", path, resp.StatusCode, b, n.errorLog())
	}
	return string(b)
}

func (n *nginxProc) errorLog() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "error.log"))
	return string(b)
}

// stop quits nginx gracefully and waits for the master to go (10 s), so a
// worker stuck in "shutting down" fails the test instead of leaking.
func (n *nginxProc) stop(t *testing.T) {
	t.Helper()
	pidFile := filepath.Join(n.dir, "nginx.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	var pid int
	if _, err := fmt.Sscanf(string(b), "%d", &pid); err != nil || pid <= 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	if testwait.For(10*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }) {
		_ = os.Remove(pidFile)
		return
	}
	// The master leads its process group: this takes the workers too.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = os.Remove(pidFile)
	t.Errorf("nginx (pid %d) did not quit within 10 s; killed", pid)
}
