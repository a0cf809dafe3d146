package nginx

import (
	"testing"
)

// rrClear is the Lua of a hot-reload framework: clear package.loaded of
// the module family.
const rrClear = `
                local function clear()
                    for k in pairs(package.loaded) do
                        if k == "resty.ffi.qrpc" or k:find("^resty%.ffi%.qrpc%.") then
                            package.loaded[k] = nil
                        end
                    end
                end
`

// TestReRequireConfigure: once the library has loaded in the worker,
// configure accepts only the settings already in force and otherwise
// returns nil, "qrpc: already loaded in this worker (...)" (docs/api.md),
// in a module instance a re-require makes too: the library is loaded in
// its VM, with the same host and wake-up socket. Otherwise the new
// instance would accept any socket_dir (and do nothing with it) or lib
// (and fail its first call).
func TestReRequireConfigure(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, AllowErrors: []string{`cannot load`, `not found`},
		Server: loc("/t", rrClear+`
                local qt = require "qtest"
                local q1 = require "resty.ffi.qrpc"
                local c1 = assert(q1.connect(qt.addr, qt.opts{ timeout = 3000 }))
                assert(c1:unary("greet", "a"))
                local function show(ok, err)
                    return ok and "true" or ("nil, " .. tostring(err):match("^[^(]*"))
                end
                ngx.say("q1 socket_dir: ", show(q1.configure{ socket_dir = "/nonexistent-qrpc-dir" }))
                clear()
                local q2 = require "resty.ffi.qrpc"
                ngx.say("q2 socket_dir: ", show(q2.configure{ socket_dir = "/nonexistent-qrpc-dir" }))
                clear()
                local q3 = require "resty.ffi.qrpc"
                ngx.say("q3 lib: ", show(q3.configure{ lib = "/nonexistent-qrpc-dir/libffi_qrpc.so" }))
                local c3, err = q3.connect(qt.addr, qt.opts{ timeout = 3000 })
                ngx.say("q3 connect: ", c3 and "ok" or err)`)})
	want := "q1 socket_dir: nil, qrpc: already loaded in this worker \n" +
		"q2 socket_dir: nil, qrpc: already loaded in this worker \n" +
		"q3 lib: nil, qrpc: already loaded in this worker \n" +
		"q3 connect: ok\n"
	if st, body := n.get("/t"); st != 200 || body != want {
		t.Fatalf("%d %q, want %q", st, body, want)
	}
}
