package nginx

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// libCopyIn writes a copy of libPath as dir/name (dir made beside libPath,
// readable by the workers' user); returns the copy's path.
func libCopyIn(t *testing.T, dirName, name string) string {
	t.Helper()
	b, err := os.ReadFile(libPath)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(filepath.Dir(libPath), dirName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// libFilesMapped: the distinct files of the library each worker maps.
// libConfigure is an init_by_lua line: configure{ lib = lib } ("": none,
// the search finds it), with the flavour's host when host is set.
func libConfigure(lib string, host bool) string {
	o := ""
	if host {
		o = fmt.Sprintf("host = %q, ", ng.Host())
	}
	if lib != "" {
		o += fmt.Sprintf("lib = %q, ", lib)
	}
	return `        assert(require("resty.ffi.qrpc").configure{ ` + o + `socket_dir = ngx.config.prefix() .. "run" })`
}

// libStart starts c and checks that its http VM loads the library and
// answers.
func libStart(t *testing.T, c ngxConf) *nginxProc {
	t.Helper()
	n := startNginx(t, c)
	if got := httpAsk(t, n, "unary echo h"); got != "OK 0 h" {
		t.Fatalf("http: %q", got)
	}
	return n
}

func libFilesMapped(t *testing.T, n *nginxProc) {
	t.Helper()
	for _, pid := range n.workerPIDs() {
		m, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, line := range strings.Split(string(m), "\n") {
			if f := strings.Fields(line); len(f) >= 6 && strings.Contains(line, "libffi_qrpc") {
				seen[f[3]+" "+f[4]] = true
			}
		}
		if len(seen) != 1 {
			t.Errorf("worker %d maps %d files of the library: %v", pid, len(seen), seen)
		}
	}
}

func libStreamAsk(t *testing.T, n *nginxProc, line string) string {
	t.Helper()
	l, err := dialLines(n.streamPort, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	got, err := l.ask(line, 20*time.Second)
	if err != nil {
		t.Logf("stream: %v", err)
	}
	return got
}

// TestLibraryLuaJITName: lib given as LuaJIT's short name "ffi_qrpc" (the form
// lua-resty-ffi users write, and the form the loader's own last resort
// uses): ffi.load("ffi_qrpc") opens libffi_qrpc.so on the linker's path,
// the very file the other VM loaded. The stream VM should load it.
func TestLibraryLuaJITName(t *testing.T) {
	requireStreamLua(t)
	for _, tc := range []struct{ name, httpLib, streamLib string }{
		{"both ffi_qrpc", "ffi_qrpc", "ffi_qrpc"},
		{"http full name, stream short name", "libffi_qrpc.so", "ffi_qrpc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := libCopyIn(t, "qrpc-lib-ld", "libffi_qrpc.so")
			c := streamConf(1)
			c.ProcEnv = []string{"LD_LIBRARY_PATH=" + filepath.Dir(p)}
			c.InitByLua = libConfigure(tc.httpLib, true)
			c.StreamInitByLua = libConfigure(tc.streamLib, false)
			c.AllowErrors = []string{`another copy of the library`}
			n := libStart(t, c)
			if got := libStreamAsk(t, n, "unary echo s"); got != "OK 0 s" {
				t.Errorf("stream VM (lib %q, same file as http's %q): %q", tc.streamLib, tc.httpLib, got)
			}
			libFilesMapped(t, n)
		})
	}
}

// TestLibraryPathWhitespace: the http VM loads a file whose directory has two
// spaces (or a tab) in its name; QRPC_LIBRARY keeps the path as
// /proc/self/maps writes it. The stream VM configured with another copy is
// refused without loading it, and with no lib it loads the recorded file.
func TestLibraryPathWhitespace(t *testing.T) {
	requireStreamLua(t)
	for _, tc := range []struct {
		name, dir string
		other     bool // the stream VM configures another copy
	}{
		{"two spaces, another copy", "qrpc  lib", true},
		{"a tab, another copy", "qrpc\tlib", true},
		{"two spaces, no lib in stream", "qrpc  lib", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := libCopyIn(t, tc.dir, "libffi_qrpc.so")
			c := streamConf(1)
			c.InitByLua = libConfigure(p, true)
			want := "OK 0 s"
			if tc.other {
				c.StreamInitByLua = libConfigure(libPath, false)
				want = fmt.Sprintf("ERR qrpc: cannot load %s: this worker runs another copy of the library (", libPath)
			} else {
				c.StreamInitByLua = libConfigure("", false)
			}
			c.AllowErrors = []string{`another copy of the library`, `not found`}
			n := libStart(t, c)
			if got := libStreamAsk(t, n, "unary echo s"); !strings.HasPrefix(got, want) {
				t.Errorf("stream VM: %q, want %q", got, want)
			}
			libFilesMapped(t, n)
		})
	}
}

// TestLibraryForeignDlopenDecl: another module of the stream VM declared dlopen
// first, with a char * argument (ffi.cdef keeps the first declaration);
// the loader's own names for dlopen and dlclose are unaffected, and a
// configure{ lib } of the file the http VM loaded loads.
func TestLibraryForeignDlopenDecl(t *testing.T) {
	requireStreamLua(t)
	c := streamConf(1)
	c.StreamInitByLua = fmt.Sprintf(`        require("ffi").cdef("void *dlopen(char *file, int mode);")
        assert(require("resty.ffi.qrpc").configure{ lib = %q, socket_dir = ngx.config.prefix() .. "run" })`, libPath)
	c.AllowErrors = []string{`loading failed`}
	n := libStart(t, c)
	if got := libStreamAsk(t, n, "unary echo s"); got != "OK 0 s" {
		t.Errorf("stream VM: %q", got)
	}
}

// TestLibraryPathForms: the same file named differently in the two VMs (and
// the stream VM with no lib): all should load the one file.
func TestLibraryPathForms(t *testing.T) {
	requireStreamLua(t)
	dir, base := filepath.Dir(libPath), filepath.Base(libPath)
	link := filepath.Join(dir, "lib-link.so")
	_ = os.Remove(link)
	if err := os.Symlink(libPath, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(link) })
	wd, _ := os.Getwd()
	rel, _ := filepath.Rel(wd, libPath)
	nl := libCopyIn(t, "qrpc\nlib", "libffi_qrpc.so")
	for _, tc := range []struct{ name, httpLib, streamLib string }{
		{"double slash", libPath, dir + "//" + base},
		{"dot segment", libPath, dir + "/./" + base},
		{"symlink", libPath, link},
		{"http symlink, stream none", link, ""},
		{"http double slash, stream none", dir + "//" + base, ""},
		{"relative to cwd", libPath, rel},
		{"http relative, stream none", rel, ""},
		{"newline in dir, stream none", nl, ""},
		{"newline in dir, both", nl, nl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := streamConf(1)
			c.InitByLua = libConfigure(tc.httpLib, true)
			if tc.streamLib != "" {
				c.StreamInitByLua = libConfigure(tc.streamLib, false)
			} else {
				c.StreamInitByLua = libConfigure("", false)
			}
			c.AllowErrors = []string{`.`}
			n := libStart(t, c)
			if got := libStreamAsk(t, n, "unary echo s"); got != "OK 0 s" {
				t.Errorf("stream VM: %q", got)
			}
			libFilesMapped(t, n)
		})
	}
}

// TestLibraryFailedFirstLoad: the http VM's load maps its file (a Go runtime
// starts at dlopen) and then fails (host = "resty_ffi" with no
// lua-resty-ffi in this nginx); qrpc_claim has recorded the file already,
// so the stream VM, given another copy, is refused and the worker maps
// one file.
func TestLibraryFailedFirstLoad(t *testing.T) {
	requireStreamLua(t)
	if ng.Host() == "resty_ffi" {
		t.Skip("needs an nginx without lua-resty-ffi")
	}
	p := libCopyIn(t, "qrpc-lib-first", "libffi_qrpc.so")
	c := streamConf(1)
	c.InitByLua = fmt.Sprintf(`        assert(require("resty.ffi.qrpc").configure{ host = "resty_ffi", lib = %q, socket_dir = ngx.config.prefix() .. "run" })`, p)
	c.AllowErrors = []string{`.`}
	n := startNginx(t, c)
	got := httpAsk(t, n, "unary echo h")
	t.Logf("http: %q", got)
	got = libStreamAsk(t, n, "unary echo s")
	t.Logf("stream: %q", got)
	if got == "OK 0 s" {
		t.Errorf("stream VM loaded %s while the http VM maps %s", libPath, p)
	}
	libFilesMapped(t, n)
}

// TestLibraryGatewayMethods: gateway.new with valid connect methods options
// (in init_by_lua, where gateways are built) is accepted.
func TestLibraryGatewayMethods(t *testing.T) {
	dir := gatewayDir(t)
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local protos = { files = { "shop.proto" }, import_paths = { "`+dir+`" } }`,
			`        local m = setmetatable({}, { __index = { } })`,
			`        m["shop.Shop/GetItem"] = { hedge = { delay = "p95", max = 2 }, try_timeout = 50, json = true, proto_names = false }`,
			`        m.Other = { hedge = false, discard_unknown = true, emit_unpopulated = true, request = "shop.Item", response = "shop.Item" }`,
			`        package.loaded.gw_m = assert(gateway.new{ upstream = { "127.0.0.1:1", "127.0.0.1:2" }, protos = protos,`,
			`            opts = { insecure = true, retries = 1, methods = m } })`,
			`        package.loaded.gw_e = assert(gateway.new{ upstream = "127.0.0.1:1", protos = protos, opts = { insecure = true, methods = {} } })`,
		),
		Server: loc("/gwm", `
                ngx.say(package.loaded.gw_m and "ok" or "none")`),
		AllowErrors: []string{`.`},
	})
	if st, body := n.get("/gwm"); st != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("%d %q", st, body)
	}
}
