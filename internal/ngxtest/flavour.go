package ngxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"text/template"
	"time"
)

// EnvNginx names the nginx the suites run against. Not NGINX: nginx reads
// that variable itself (sockets inherited from an upgrading master) and
// misbehaves when it holds a path.
const EnvNginx = "QRPC_NGINX"

// EnvBuildDir is where `make test-openresty` / `make test-resty-ffi` build
// their nginx (default: .build/ in the repository).
const EnvBuildDir = "QRPC_BUILD_DIR"

// The flavours: what the binary is, derived from it, whatever it was called.
const (
	Debian    = "debian"    // Debian's nginx, ngx_lua and lua-resty-core from apt
	OpenResty = "openresty" // nginx with ngx_lua built in and its own lualib
	RestyFFI  = "resty-ffi" // an nginx with lua-resty-ffi's libresty_ffi.so beside it
)

// Nginx is one nginx binary and what running this project's Lua code in
// it takes. Everything is derived from the binary (`nginx -V`, files next
// to its prefix, and a probe run of its init_by_lua), never from where
// Debian puts things.
type Nginx struct {
	Bin     string // absolute path
	Flavour string // Debian, OpenResty or RestyFFI
	Version string // "nginx/1.22.1", "openresty/1.27.1.2"
	Prefix  string // its --prefix

	// Modules are the load_module paths (NDK, then ngx_lua) when ngx_lua
	// is a dynamic module; nil when it is compiled in.
	Modules []string
	// LuaPath are lua_package_path entries (before ";;") that make
	// lua-resty-core, the jit.* modules and resty_ffi.lua found, the
	// binary's own before the system's.
	LuaPath []string
	// RestyFFILib is the directory of libresty_ffi.so and resty_ffi.lua
	// (lua-resty-ffi), "" when the binary has none beside it. Workers then
	// need LD_LIBRARY_PATH=RestyFFILib and `require "resty_ffi"` in
	// init_by_lua (it defines ngx.load_ffi).
	RestyFFILib string

	// What the probe found.
	Pipe       bool   // ngx.pipe loads (OpenResty's socket_cloexec patch)
	PipeErr    string // why it does not
	Lua52Exec  bool   // os.execute returns true|nil, "exit", code (LuaJIT's Lua 5.2 compat)
	CorePath   string // the resty/core.lua that init_by_lua loaded
	CoreVer    string // its version
	LoadFFIFun bool   // ngx.load_ffi exists after the host's init code

	// StreamLua: ngx_stream_lua is compiled in (stream {} blocks run Lua);
	// NoStreamLua says why not when it is false.
	StreamLua   bool
	NoStreamLua string
}

// MainConf returns the main-level directives the binary needs: its
// load_module lines and, for lua-resty-ffi, `env LD_LIBRARY_PATH;`.
func (n *Nginx) MainConf() string {
	var b strings.Builder
	for _, m := range n.Modules {
		fmt.Fprintf(&b, "load_module %s;\n", m)
	}
	if n.RestyFFILib != "" {
		b.WriteString("env LD_LIBRARY_PATH;\n")
	}
	return b.String()
}

// PackagePath returns a lua_package_path value: first, then the binary's
// own entries, then nginx's default (";;").
func (n *Nginx) PackagePath(first ...string) string {
	return strings.Join(append(append(append([]string(nil), first...), n.LuaPath...), ";"), ";")
}

// InitLua is the init_by_lua code the host needs before anything else:
// lua-resty-ffi's `require "resty_ffi"` (it defines ngx.load_ffi).
func (n *Nginx) InitLua() string {
	if n.RestyFFILib == "" {
		return ""
	}
	return `require "resty_ffi"`
}

// Host is the qrpc host the suites configure on this nginx: "resty_ffi"
// where lua-resty-ffi is there, so every call goes through it.
func (n *Nginx) Host() string {
	if n.RestyFFILib != "" {
		return "resty_ffi"
	}
	return "builtin"
}

// Environ returns env (os.Environ() when nil) fixed for starting nginx:
// without NGINX (nginx would read it as inherited sockets), with the
// binary's LD_LIBRARY_PATH entries first. extra K=V pairs are added; an
// extra LD_LIBRARY_PATH is joined with the binary's, not lost.
func (n *Nginx) Environ(env []string, extra ...string) []string {
	if env == nil {
		env = os.Environ()
	}
	var out []string
	var ldPath []string
	if n.RestyFFILib != "" {
		ldPath = append(ldPath, n.RestyFFILib)
	}
	for _, kv := range append(append([]string(nil), env...), extra...) {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "NGINX":
			continue
		case "LD_LIBRARY_PATH":
			if v != "" {
				ldPath = append(ldPath, v)
			}
			continue
		}
		out = append(out, kv)
	}
	if len(ldPath) > 0 {
		out = append(out, "LD_LIBRARY_PATH="+strings.Join(ldPath, ":"))
	}
	return out
}

// Command is exec.Command for this nginx, with Environ's environment.
func (n *Nginx) Command(args ...string) *exec.Cmd {
	cmd := exec.Command(n.Bin, args...)
	cmd.Env = n.Environ(nil)
	return cmd
}

func (n *Nginx) String() string {
	return fmt.Sprintf("%s (%s, %s): modules %v, lua path %v, resty-core %s %s, ngx.pipe %v, Lua 5.2 os.execute %v, lua-resty-ffi %q",
		n.Bin, n.Flavour, n.Version, n.Modules, n.LuaPath, n.CoreVer, n.CorePath, n.Pipe, n.Lua52Exec, n.RestyFFILib)
}

var (
	findOnce sync.Once
	found    *Nginx
	findErr  error
)

// Find returns the nginx QRPC_NGINX names, probed once per process:
//
//	unset or ""   the nginx installed on the machine (PATH, then /usr/sbin)
//	debian        the same, and it must be a Debian-style one
//	openresty     BuildDir()/openresty/sbin/nginx (make test-openresty builds it)
//	resty-ffi     BuildDir()/resty-ffi/sbin/nginx (make test-resty-ffi builds it)
//	a path        that binary
//
// A flavour name that does not match what the binary turns out to be is
// an error, so a mix-up cannot pass for a run on the named flavour.
func Find() (*Nginx, error) {
	findOnce.Do(func() { found, findErr = find(os.Getenv(EnvNginx)) })
	return found, findErr
}

func find(sel string) (*Nginx, error) {
	var bin string
	var err error
	switch sel {
	case "", Debian:
		bin, err = LookPath("nginx")
		if err != nil {
			return nil, fmt.Errorf("%w (apt-get install nginx libnginx-mod-http-lua lua-resty-core)", err)
		}
	case OpenResty, RestyFFI:
		dir, err := BuildDir()
		if err != nil {
			return nil, err
		}
		bin = filepath.Join(dir, sel, "sbin", "nginx")
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("%s=%s: %s is not built (make test-%s builds it)", EnvNginx, sel, bin, sel)
		}
	default:
		if !strings.Contains(sel, "/") {
			return nil, fmt.Errorf("%s=%q: want debian, openresty, resty-ffi or the path of an nginx binary", EnvNginx, sel)
		}
		bin = sel
	}
	n, err := Probe(bin)
	if err != nil {
		return nil, err
	}
	if sel != "" && !strings.Contains(sel, "/") && sel != n.Flavour {
		return nil, fmt.Errorf("%s=%s, but %s is %s", EnvNginx, sel, bin, n)
	}
	return n, nil
}

// BuildDir is QRPC_BUILD_DIR, or .build in the repository.
func BuildDir() (string, error) {
	if d := os.Getenv(EnvBuildDir); d != "" {
		return filepath.Abs(d)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".build"), nil
}

// RepoRoot is the directory of go.mod above the working directory (tests
// run in their package's directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
	}
}

var (
	reVersion = regexp.MustCompile(`(?m)^nginx version: (\S+)`)
	rePrefix  = regexp.MustCompile(`--prefix=(\S+)`)
	reModPath = regexp.MustCompile(`--modules-path=(\S+)`)
	// ngx_lua compiled in: OpenResty's bundle calls it ngx_lua-*, its
	// repository lua-nginx-module, Debian's source package http-lua.
	reStaticLua = regexp.MustCompile(`--add-module=\S*(ngx_lua|lua-nginx-module|http-lua)`)
	// ngx_stream_lua compiled in: its repository stream-lua-nginx-module,
	// OpenResty's bundle ngx_stream_lua-*.
	reStreamLua = regexp.MustCompile(`--add-module=\S*(stream-lua-nginx-module|ngx_stream_lua)`)
)

// Probe describes the nginx at bin from `bin -V`, the files next to its
// prefix and a `bin -t` run whose init_by_lua reports what Lua sees.
func Probe(bin string) (*Nginx, error) {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := exec.CommandContext(ctx, bin, "-V").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s -V: %v\n%s", bin, err, v)
	}
	n := &Nginx{Bin: bin, Prefix: "/usr/local/nginx"}
	if m := reVersion.FindSubmatch(v); m != nil {
		n.Version = string(m[1])
	}
	if m := rePrefix.FindSubmatch(v); m != nil {
		n.Prefix = strings.TrimSuffix(string(m[1]), "/")
	}
	switch {
	case reStreamLua.Match(v) && strings.Contains(string(v), "--with-stream"):
		n.StreamLua = true
	case !strings.Contains(string(v), "--with-stream"):
		n.NoStreamLua = n.Version + " is built without the stream module (no --with-stream)"
	default:
		n.NoStreamLua = n.Version + " has no ngx_stream_lua (stream-lua-nginx-module) built in"
	}
	if !reStaticLua.Match(v) {
		dir := filepath.Join(n.Prefix, "modules")
		if m := reModPath.FindSubmatch(v); m != nil {
			dir = string(m[1])
		}
		lua := filepath.Join(dir, "ngx_http_lua_module.so")
		if !exists(lua) {
			return nil, fmt.Errorf("%s has no ngx_lua built in and %s is missing (apt-get install libnginx-mod-http-lua)", bin, lua)
		}
		// ngx_lua as a module needs NDK loaded first (Debian builds it so).
		if ndk := filepath.Join(dir, "ndk_http_module.so"); exists(ndk) {
			n.Modules = append(n.Modules, ndk)
		}
		n.Modules = append(n.Modules, lua)
	}

	// lua-resty-ffi next to the binary (build-resty-ffi.sh: PREFIX/lib).
	if lib := filepath.Join(n.Prefix, "lib"); exists(filepath.Join(lib, "libresty_ffi.so")) && exists(filepath.Join(lib, "resty_ffi.lua")) {
		n.RestyFFILib = lib
		n.LuaPath = append(n.LuaPath, lib+"/?.lua")
	}
	// lua-resty-core: the binary's own lualib (OpenResty: PREFIX/lualib,
	// or ../lualib of an nginx/ prefix) wins; only without one the
	// system's, never both (an older system copy first breaks a newer
	// ngx_lua).
	own := ""
	for _, d := range []string{filepath.Join(n.Prefix, "lualib"), filepath.Join(filepath.Dir(n.Prefix), "lualib")} {
		if exists(filepath.Join(d, "resty", "core.lua")) {
			own = d
			break
		}
	}
	if own != "" {
		n.LuaPath = append(n.LuaPath, own+"/?.lua", own+"/?/init.lua")
	} else {
		for _, d := range []string{"/usr/local/share/lua/5.1", "/usr/share/lua/5.1"} {
			if exists(filepath.Join(d, "resty", "core.lua")) {
				n.LuaPath = append(n.LuaPath, d+"/?.lua", d+"/?/init.lua")
				break
			}
		}
		// Debian's LuaJIT keeps jit.* (jit.v) outside its default path.
		if m, _ := filepath.Glob("/usr/share/luajit*/jit/v.lua"); len(m) > 0 {
			n.LuaPath = append(n.LuaPath, filepath.Dir(filepath.Dir(m[0]))+"/?.lua")
		}
	}

	switch {
	case n.RestyFFILib != "":
		n.Flavour = RestyFFI
	case own != "" || len(n.Modules) == 0:
		n.Flavour = OpenResty
	default:
		n.Flavour = Debian
	}
	if err := n.probeLua(ctx); err != nil {
		return nil, err
	}
	if own != "" && !strings.HasPrefix(n.CorePath, own+"/") {
		return nil, fmt.Errorf("%s: init_by_lua loaded %s, not the binary's own lualib %s", bin, n.CorePath, own)
	}
	return n, nil
}

var probeConf = template.Must(template.New("probe").Parse(`
{{.Main}}
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/error.log notice;
events { worker_connections 16; }
http {
    lua_package_path "{{.Path}}";
    client_body_temp_path {{.Dir}}/body;
    proxy_temp_path {{.Dir}}/proxy;
    fastcgi_temp_path {{.Dir}}/fastcgi;
    uwsgi_temp_path {{.Dir}}/uwsgi;
    scgi_temp_path {{.Dir}}/scgi;
    init_by_lua_block {
        {{.Init}}
        local f = assert(io.open("{{.Dir}}/probe.out", "w"))
        local a, b, c = os.execute("exit 3")
        f:write("exec=", tostring(a), " ", tostring(b), " ", tostring(c), "\n")
        local ok, err = pcall(require, "ngx.pipe")
        f:write("pipe=", tostring(ok), "\n")
        if not ok then f:write("pipe_err=", (tostring(err):gsub("%s+", " ")), "\n") end
        f:write("core=", tostring(package.searchpath("resty.core", package.path)), "\n")
        f:write("core_version=", tostring(require("resty.core").version), "\n")
        f:write("load_ffi=", type(ngx.load_ffi), "\n")
        f:close()
        -- Done: nginx need not open a port or fork.
        os.exit(0)
    }
}
`))

// probeLua starts nginx once in the foreground, without a master, with an
// init_by_lua that writes what Lua has in this binary and exits (`nginx
// -t` would not do: ngx_lua skips init_by_lua when testing the config).
func (n *Nginx) probeLua(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "qrpc-ngxprobe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var conf bytes.Buffer
	if err := probeConf.Execute(&conf, map[string]string{
		"Main": n.MainConf(), "Dir": dir, "Path": n.PackagePath(), "Init": n.InitLua(),
	}); err != nil {
		return err
	}
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, conf.Bytes(), 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, n.Bin, "-g", "daemon off; master_process off;", "-p", dir+"/", "-c", confPath, "-e", filepath.Join(dir, "error.log"))
	cmd.Env = n.Environ(nil)
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		return fmt.Errorf("probing %s (%s): %v\n%s%s", n.Bin, n.Flavour, err, out, log)
	}
	out, err := os.ReadFile(filepath.Join(dir, "probe.out"))
	if err != nil {
		return fmt.Errorf("probing %s: init_by_lua wrote nothing: %w", n.Bin, err)
	}
	kv := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			kv[k] = v
		}
	}
	switch kv["exec"] {
	case "768 nil nil": // Lua 5.1: the wait status
	case "nil exit 3":
		n.Lua52Exec = true
	default:
		return fmt.Errorf("probing %s: os.execute(\"exit 3\") returned %q", n.Bin, kv["exec"])
	}
	n.Pipe, n.PipeErr = kv["pipe"] == "true", kv["pipe_err"]
	n.CorePath, n.CoreVer = kv["core"], kv["core_version"]
	n.LoadFFIFun = kv["load_ffi"] == "function"
	if n.RestyFFILib != "" && !n.LoadFFIFun {
		return errors.New("probing " + n.Bin + ": require \"resty_ffi\" did not define ngx.load_ffi")
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
