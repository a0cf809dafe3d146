package nginx

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestCodeCacheOff: lua_code_cache off gives each request a Lua VM of its
// own, and the library serves one Lua VM per subsystem and worker. The
// first request's VM keeps the subsystem; a later request's connect is
// refused with a clear error, and the first VM's dispatcher is left
// alone. Before, each new VM took over the first one's completion queue
// and wake-up socket: the second request timed out, and the first VM's
// dispatcher reopened its socket in a loop, filling the error log
// ("qrpc: wake-up socket: closed") at most of a CPU.
func TestCodeCacheOff(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, HTTP: "lua_code_cache off;",
		AllowErrors: []string{`lua_code_cache off`},
		AllowAlerts: []string{`lua_code_cache is off`},
		Server: loc("/t", `
                local qt = require "qtest"
                local qrpc = require "resty.ffi.qrpc"
                local conn, err = qrpc.connect(qt.addr, qt.opts{ timeout = 2000 })
                if not conn then return ngx.say("connect: ", err) end
                local res, err = conn:unary("greet", "x")
                ngx.say(res and res.body or err)`)})
	if st, body := n.get("/t"); st != 200 || body != "hello, x\n" {
		t.Fatalf("first request: %d %q", st, body)
	}
	// Each refused VM leaves nothing open behind it (with the
	// lua-resty-ffi host too, whose own load runs first).
	pid := n.workerPIDs()[0]
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	var before int
	for i := 2; i <= 50; i++ {
		if i == 5 {
			before = fds()
		}
		st, body := n.get("/t")
		if st != 200 || !strings.HasPrefix(body, "connect: qrpc: http Lua VM: ") || !strings.Contains(body, "lua_code_cache off") {
			t.Fatalf("request %d: %d %q, want the refusal of a second Lua VM", i, st, body)
		}
	}
	if after := fds(); after > before+2 {
		t.Errorf("the worker's open files grew from %d to %d over 45 refused requests", before, after)
	}
	if c := n.logCount(`wake-up socket`); c != 0 {
		t.Fatalf("%d wake-up socket lines in the error log:\n%s", c, n.errorLog())
	}
}

// TestReRequire: a Lua VM that clears package.loaded of the modules and
// requires resty.ffi.qrpc again (as hot-reload frameworks do) is the same
// Lua VM: the new module instance is served, and so are the connections
// of the first instance, including a call of the first instance that is
// in flight across the re-require. The first instance's dispatcher goes
// on serving both: no wake-up socket is reopened.
func TestReRequire(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qt = require "qtest"
                local function clear()
                    for k in pairs(package.loaded) do
                        if k == "resty.ffi.qrpc" or k:find("^resty%.ffi%.qrpc%.") then
                            package.loaded[k] = nil
                        end
                    end
                end
                local function greet(q, who)
                    local conn, err = q.connect(qt.addr, qt.opts{ timeout = 3000 })
                    if not conn then return "connect: " .. err end
                    local res, cerr = conn:unary("greet", who)
                    return res and res.body or cerr
                end
                local q1 = require "resty.ffi.qrpc"
                ngx.say("1: ", greet(q1, "a"))
                -- a call of the first instance in flight across the re-require
                local c1 = assert(q1.connect(qt.addr, qt.opts{ timeout = 3000 }))
                local th = ngx.thread.spawn(function()
                    local res, err = c1:unary("slow", "300")
                    return res and res.body or err
                end)
                clear()
                local q2 = require "resty.ffi.qrpc"
                ngx.say("new instance: ", q1 ~= q2)
                ngx.say("2: ", greet(q2, "b"))
                local _, slow = ngx.thread.wait(th)
                ngx.say("in flight: ", slow)
                ngx.say("old conn: ", greet(q1, "c"))
                clear()
                local q3 = require "resty.ffi.qrpc"
                ngx.say("3: ", greet(q3, "d"))`)})
	want := "1: hello, a\nnew instance: true\n2: hello, b\nin flight: slept 300\nold conn: hello, c\n3: hello, d\n"
	for i := 1; i <= 3; i++ {
		if st, body := n.get("/t"); st != 200 || body != want {
			t.Fatalf("request %d: %d %q, want %q\n%s", i, st, body, want, n.errorLog())
		}
	}
	if c := n.logCount(`wake-up socket`); c != 0 {
		t.Fatalf("%d wake-up socket lines in the error log:\n%s", c, n.errorLog())
	}
}
