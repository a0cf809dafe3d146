package main

// The run's environment: the library build every figure loads, the
// servers they call, and the nginx instances they prepare from it.

import (
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"text/template"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
)

type env struct {
	root     string
	dir      string
	lib      string
	caPEM    []byte
	caFile   string
	qrpcAddr string
	pair     certs.Pair // the servers' certificate: the pools figure starts more of them
	srvPID   int
	udsPath  string
	httpAddr string
	sidecar  *child
	tmpl     *template.Template
	nginx    *nginx
	stops    []func() // the processes and servers newEnv started, last first
}

// newNginx prepares (does not start) an nginx whose files live in dir:
// bin is the binary, host the library's host, restyLib lua-resty-ffi's
// directory when bin was built for it.
func (e *env) newNginx(bin, dir, host, restyLib string) (*nginx, error) {
	// nginx workers run as an unprivileged user: they must read the config
	// module and the library, and create their wake-up socket here.
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, err
	}
	cfgLua := fmt.Sprintf("return { addr = %q, ca = [[\n%s]], uds = %q, proto = %q, rest_proto = %q, rest_dir = %q, proto_dir = %q }\n",
		e.qrpcAddr, e.caPEM, e.udsPath,
		filepath.Join(e.root, "demo", "proto", "greeter.proto"),
		filepath.Join(e.root, "bench", "proto", "bench_http.proto"),
		filepath.Join(e.root, "bench", "proto"),
		filepath.Join(e.root, "demo", "proto"))
	if err := os.WriteFile(filepath.Join(dir, "bench_config.lua"), []byte(cfgLua), 0o644); err != nil {
		return nil, err
	}
	n := &nginx{bin: bin, dir: dir, tmpl: e.tmpl, data: map[string]any{
		"Dir": dir, "LuaDir": filepath.Join(e.root, "lua"), "BenchLua": filepath.Join(e.root, "bench", "lua"),
		"Lib": e.lib, "HTTPAddr": e.httpAddr, "Host": host, "RestyLib": restyLib,
		// A build for lua-resty-ffi has ngx_lua built in: no load_module.
		"Static": restyLib != "",
	}}
	if e.sidecar != nil {
		n.data["SidecarAddr"] = e.sidecar.addr
	}
	if restyLib != "" {
		n.env = []string{"LD_LIBRARY_PATH=" + restyLib}
	}
	return n, nil
}

// newEnv builds the library into dir and starts what every figure calls:
// the qrpc echo server, the sidecar, the unix-socket and HTTP echo
// servers. close stops them (also what it started before an error).
func newEnv(root, dir string) (*env, error) {
	e := &env{root: root, dir: dir, lib: filepath.Join(dir, "libffi_qrpc.so")}
	log.Printf("building %s", e.lib)
	built := filepath.Join(dir, ".libffi_qrpc.so.built")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", built, "./ffi")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return e, fmt.Errorf("build library: %w", err)
	}
	// Loaded from a copy made as make install makes it: the page cache
	// of a file the linker has just written holds folios of up to 2 MB,
	// and the kernel maps a whole folio at a touch, so an idle worker's
	// RSS would count more of the library than it does in production
	// (docs/tuning.md "Idle cost").
	inst := exec.Command("install", "-m", "755", built, e.lib)
	inst.Stdout, inst.Stderr = os.Stderr, os.Stderr
	if err := inst.Run(); err != nil {
		return e, fmt.Errorf("install library: %w", err)
	}
	_ = os.Remove(built)

	ca, err := certs.NewCA("bench ca")
	if err != nil {
		return e, err
	}
	pair, err := ca.Issue(certs.Options{Hosts: []string{"localhost", "127.0.0.1"}})
	if err != nil {
		return e, err
	}
	srv, err := startServerProcess(dir, pair)
	if err != nil {
		return e, err
	}
	e.stops = append(e.stops, srv.stop)
	e.qrpcAddr, e.srvPID, e.caPEM, e.pair = srv.addr, srv.pid, ca.CertPEM, pair
	e.caFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(e.caFile, ca.CertPEM, 0o644); err != nil {
		return e, err
	}
	e.sidecar, err = startChild("-sidecar", e.qrpcAddr, "-ca", e.caFile)
	if err != nil {
		return e, err
	}
	e.stops = append(e.stops, e.sidecar.stop)

	e.udsPath = filepath.Join(dir, "echo.sock")
	stopUDS, err := startUDSEcho(e.udsPath)
	if err != nil {
		return e, err
	}
	e.stops = append(e.stops, stopUDS)
	var stopHTTP func()
	e.httpAddr, stopHTTP, err = startHTTPEcho()
	if err != nil {
		return e, err
	}
	e.stops = append(e.stops, stopHTTP)
	return e, nil
}

// close stops what newEnv started.
func (e *env) close() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
}
