package nginx

import (
	"fmt"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestReRequireConfigureAfterLoad: a module instance made by a re-require
// accepts configure{ lib, socket_dir } equal to the settings the VM loaded
// with, and refuses others, before and after its own first call (docs/
// design.md "what the library loaded with stays in force ... as the first
// instance's does"). Its first call must not forget what it accepted.
func TestReRequireConfigureAfterLoad(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", rrClear+`
                local qt = require "qtest"
                local lib, dir = ngx.var.arg_lib, ngx.var.arg_dir
                local q1 = require "resty.ffi.qrpc"
                local c1 = assert(q1.connect(qt.addr, qt.opts{ timeout = 3000 }))
                assert(c1:unary("greet", "a"))
                local function show(ok, err)
                    return ok and "true" or ("nil, " .. tostring(err):match("^[^(]*"))
                end
                clear()
                local q2 = require "resty.ffi.qrpc"
                ngx.say("before, in force: ", show(q2.configure{ lib = lib, socket_dir = dir }))
                ngx.say("before, /tmp: ", show(q2.configure{ lib = lib, socket_dir = "/tmp" }))
                local c2, err = q2.connect(qt.addr, qt.opts{ timeout = 3000 })
                ngx.say("q2 connect: ", c2 and "ok" or err)
                ngx.say("after, in force: ", show(q2.configure{ lib = lib, socket_dir = dir }))
                ngx.say("after, /tmp: ", show(q2.configure{ lib = lib, socket_dir = "/tmp" }))
                ngx.say("host: ", q1.stats().host, " ", q2.stats().host)`)})
	dir := filepath.Join(n.dir, "run")
	want := "before, in force: true\n" +
		"before, /tmp: nil, qrpc: already loaded in this worker \n" +
		"q2 connect: ok\n" +
		"after, in force: true\n" +
		"after, /tmp: nil, qrpc: already loaded in this worker \n" +
		fmt.Sprintf("host: %s %s\n", ng.Host(), ng.Host())
	if st, body := n.get("/t?lib=" + libPath + "&dir=" + dir); st != 200 || body != want {
		t.Fatalf("%d\n%s\nwant\n%s", st, body, want)
	}
}

// TestReRequireConfigureHost: on lua-resty-ffi's nginx, a VM whose first
// instance loaded with configure{ host = "builtin" }; a re-required
// instance's configure{ host = "builtin" } is accepted, and that instance
// must then run the host in force (builtin), not the default one
// (resty_ffi), and keep accepting host = "builtin".
func TestReRequireConfigureHost(t *testing.T) {
	if ng.Host() != "resty_ffi" {
		t.Skip("needs lua-resty-ffi (QRPC_NGINX=resty-ffi)")
	}
	n := startNginx(t, ngxConf{Workers: 1,
		InitByLua: `        assert(require("resty.ffi.qrpc").configure{ host = "builtin", lib = "` + libPath + `"})`,
		Server: loc("/t", rrClear+`
                local qt = require "qtest"
                local q1 = require "resty.ffi.qrpc"
                local c1 = assert(q1.connect(qt.addr, qt.opts{ timeout = 3000 }))
                assert(c1:unary("greet", "a"))
                local function show(ok, err)
                    return ok and "true" or ("nil, " .. tostring(err):match("^[^(]*"))
                end
                clear()
                local q2 = require "resty.ffi.qrpc"
                ngx.say("before: ", show(q2.configure{ host = "builtin" }))
                local c2, err = q2.connect(qt.addr, qt.opts{ timeout = 3000 })
                ngx.say("q2 connect: ", c2 and "ok" or err)
                ngx.say("after: ", show(q2.configure{ host = "builtin" }))
                ngx.say("host: ", q1.stats().host, " ", q2.stats().host)`)})
	want := "before: true\nq2 connect: ok\nafter: true\nhost: builtin builtin\n"
	if st, body := n.get("/t"); st != 200 || body != want {
		t.Fatalf("%d\n%s\nwant\n%s", st, body, want)
	}
}

// TestReRequireConfigureAfterLoadStream: TestReRequireConfigureAfterLoad
// in the stream VM.
func TestReRequireConfigureAfterLoadStream(t *testing.T) {
	requireStreamLua(t)
	n := startNginx(t, ngxConf{Workers: 1, Stream: `
    server {
        listen 127.0.0.1:{{.StreamPort}};
        content_by_lua_block {` + rrClear + `
                local qt = require "qtest"
                local dir = ngx.config.prefix():gsub("/$", "") .. "/run"
                local q1 = require "resty.ffi.qrpc"
                local c1 = assert(q1.connect(qt.addr, qt.opts{ timeout = 3000 }))
                assert(c1:unary("greet", "a"))
                local lib = q1.stats().lib
                local function show(ok, err)
                    return ok and "true" or ("nil, " .. tostring(err):match("^[^(]*"))
                end
                ngx.say("first, in force: ", show(q1.configure{ lib = lib, socket_dir = dir }))
                clear()
                local q2 = require "resty.ffi.qrpc"
                ngx.say("before, in force: ", show(q2.configure{ lib = lib, socket_dir = dir }))
                local c2, err = q2.connect(qt.addr, qt.opts{ timeout = 3000 })
                ngx.say("q2 connect: ", c2 and "ok" or err)
                ngx.say("after, in force: ", show(q2.configure{ lib = lib, socket_dir = dir }))
                ngx.say("after, /tmp: ", show(q2.configure{ lib = lib, socket_dir = "/tmp" }))
        }
    }
`})
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.streamPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	want := "first, in force: true\n" +
		"before, in force: true\n" +
		"q2 connect: ok\n" +
		"after, in force: true\n" +
		"after, /tmp: nil, qrpc: already loaded in this worker \n"
	if string(b) != want {
		t.Fatalf("\n%s\nwant\n%s", b, want)
	}
}
