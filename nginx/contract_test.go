package nginx

import (
	"strings"
	"testing"
)

// TestOpaqueConnection: a connection object answers its five methods and
// nothing else; what it stands for (handle, cache entry, credentials,
// semaphore) is out of reach, and assigning its fields changes nothing.
func TestOpaqueConnection(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local out = {}
                for _, k in ipairs({ "entry", "handle", "closed", "configure", "connect",
                                     "metrics", "stats_raw", "methods", "timeout", "addr" }) do
                    if conn[k] ~= nil then out[#out + 1] = k end
                end
                local fns = {}
                for _, k in ipairs({ "unary", "event", "close", "stats", "peers" }) do
                    fns[#fns + 1] = type(conn[k])
                end
                local n = 0
                for _ in pairs(conn) do n = n + 1 end
                conn.closed = true
                conn.handle = 0
                conn.unary = function() return "hijacked" end
                local res = conn:unary("echo", "still")
                ngx.say("exposed: ", table.concat(out, ","))
                ngx.say("methods: ", table.concat(fns, ","))
                ngx.say("fields: ", n, " metatable: ", type(getmetatable(conn)))
                ngx.say("after assignments: ", res and res.body or "broken")
                ngx.say("setmetatable: ", (pcall(setmetatable, conn, {})))`)})
	st, body := n.get("/t")
	want := "exposed: \nmethods: function,function,function,function,function\nfields: 0 metatable: string\n" +
		"after assignments: still\nsetmetatable: false\n"
	if st != 200 || body != want {
		t.Fatalf("%d\n%s\nwant\n%s", st, body, want)
	}
}

// TestContractFixes: what Go would refuse is refused in Lua
// ("bad command:" never reaches a caller: an IPv6 host without brackets,
// such a resolver, a hash_key over 64 KiB); unknown and misplaced call
// options are refused; a false body is "bad argument #3"; methods bound
// by one connect do not leak into another connect's object over the same
// connection; a constantly used connection is not the first evicted.
func TestContractFixes(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, AllowErrors: nil, Server: loc("/t", connectT+`
                local function p(...) ngx.say(select(2, ...)) end
                p(qrpc.connect("::1:8443"))
                p(qrpc.connect({ "::1:8443", "127.0.0.1:1" }))
                p(qrpc.connect({ "[::1]:1", "127.0.0.1:1" }, { resolver = "::1:53" }))
                local hashed = assert(qrpc.connect({ qt.addr, "127.0.0.2:1" }, qt.opts({ balance = "hash" })))
                p(hashed:unary("echo", "x", { hash_key = string.rep("k", 65537) }))
                p(conn:unary("echo", "x", { tiemout = 100 }))
                p(conn:event("echo", "x", { timeout = 100 }))
                p(conn:event("echo", "x", { [1] = true }))
                p(conn:unary("greet", false))
                p(conn:event("notify", false))
                -- methods: one object per methods table, one connection
                local a = assert(qt.connect({ methods = { Hello = { request = "demo.A" } } }))
                local b = assert(qt.connect({ methods = { Hello = { response = "demo.B" } } }))
                local va, vb = require("resty.ffi.qrpc.testing").view(a), require("resty.ffi.qrpc.testing").view(b)
                ngx.say("shared connection: ", va.e == vb.e, ", a: ", va.methods.Hello.request,
                        " ", tostring(va.methods.Hello.response), ", b: ", tostring(vb.methods.Hello.request),
                        " ", vb.methods.Hello.response)
                local a2 = assert(qt.connect({ methods = { Hello = { request = "demo.A" } } }))
                ngx.say("same methods table, new object: ", a2 ~= a)`)})
	st, body := n.get("/t")
	want := strings.Join([]string{
		`bad argument #1: addr must be host:port, an IPv6 host in brackets ([::1]:8443) (got "::1:8443")`,
		`bad argument #1: addrs[1] must be host:port, an IPv6 host in brackets ([::1]:8443) (got "::1:8443")`,
		`bad argument #2: resolver must be a string host:port`,
		`bad argument #4: hash_key must be at most 65536 bytes (got 65537)`,
		`bad argument #4: unknown option 'tiemout'`,
		`bad argument #4: option 'timeout' does not apply to events`,
		`bad argument #4: option names must be strings (got number)`,
		`bad argument #3: body must be a string (got boolean)`,
		`bad argument #3: body must be a string (got boolean)`,
		`shared connection: true, a: demo.A nil, b: nil demo.B`,
		`same methods table, new object: true`,
	}, "\n") + "\n"
	if st != 200 || body != want {
		t.Fatalf("%d\n%s\nwant\n%s", st, body, want)
	}
}

// TestGatewayBodyOverFrame: a gateway body that fits max_body but not the
// connection's max_frame_size is refused in Lua before it is sent
// ("bad argument #3: body too large ..."): the gateway answers 413, as
// for "too large:", not 500.
func TestGatewayBodyOverFrame(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local errors = require "resty.ffi.qrpc.gateway.errors"
                return errors.upstream_error({ conf = { retry_after = 1 } },
                    "bad argument #3: body too large (2000 bytes; max_frame_size is 1024)", nil)`)})
	st, body := n.get("/t")
	if st != 413 {
		t.Fatalf("%d %q, want 413", st, body)
	}
}

// TestEvictionByUse: when connect must make room, it closes the idle
// connection used least recently, not the one dialled first: a
// connection kept by its caller and used on every request survives.
func TestEvictionByUse(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                assert(qrpc.configure{ max_connections = 2 })
                local a = assert(qt.connect({ streams = 2 }))   -- dialled first
                local b = assert(qt.connect({ streams = 3 }))
                assert(b:unary("echo", "b"))
                assert(a:unary("echo", "a"))                    -- used last
                local c = assert(qt.connect({ streams = 4 }))   -- needs room
                local ra, ea = a:unary("echo", "a")
                local rb, eb = b:unary("echo", "b")
                ngx.say("a: ", ra and ra.body or ea, ", b: ", rb and rb.body or eb, ", c: ", c:unary("echo", "c").body)`)})
	st, body := n.get("/t")
	if st != 200 || body != "a: a, b: closed, c: c\n" {
		t.Fatalf("%d %q", st, body)
	}
}

// TestKilledConnectLeaksNothing: the light thread that connects is
// killed while the dial is in flight; the dial still completes into the
// connection cache (on either host: a dial goes through the completion
// queue), so the next connect with the same options finds it at once and
// the worker holds one QUIC connection, not a leaked one and a second.
// It runs on the host this nginx's suites use (built-in; lua-resty-ffi on
// the resty-ffi flavour) and on every nginx through the lua-resty-ffi
// stand-in, which drops a killed thread's answer as lua-resty-ffi does.
func TestKilledConnectLeaksNothing(t *testing.T) {
	requireNginx(t)
	lua := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                assert(qrpc.init_worker())
                local before = qrpc.stats().connections
                local th = ngx.thread.spawn(function() return qt.connect({ streams = 5 }) end)
                ngx.thread.kill(th)
                -- the dial goes on without its thread: a bounded wait for
                -- the cache to hold it
                qt.wait(10, function() return qrpc.stats().connections - before >= 1 end)
                local conn, err = qt.connect({ streams = 5 })
                local res = conn and conn:unary("echo", "x")
                ngx.say("host ", qrpc.stats().host, ", answer ", res and res.body or err,
                        ", connections ", qrpc.stats().connections - before)`
	blocks := []block{{
		name: "host " + ng.Host(),
		conf: ngxConf{Workers: 1, Server: loc("/t", lua)},
		body: "host " + ng.Host() + ", answer x, connections 1\n",
	}}
	if shimPath != "" {
		blocks = append(blocks, block{
			name: "lua-resty-ffi stand-in",
			conf: ngxConf{Workers: 1, InitByLua: `
        local qt = require "qtest"
        require("fake_resty_ffi").install(qt.shim)
        assert(require("resty.ffi.qrpc").configure{ host = "resty_ffi", lib = qt.lib, socket_dir = qt.dir .. "/run" })`,
				Server: loc("/t", lua)},
			body: "host resty_ffi, answer x, connections 1\n",
		})
	} else {
		t.Logf("lua-resty-ffi stand-in unavailable: %v", shimErr)
	}
	runBlocks(t, blocks)
}

// TestCancelRetriedWhenQueueFull: a cancel that the submit queue refuses
// as full is kept and sent again at the dispatcher's next sweep, not
// dropped (Go would hold the call until its deadline). The library is a
// stand-in here whose queue refuses the first cancel.
func TestCancelRetriedWhenQueueFull(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local abi = require "resty.ffi.qrpc.abi"
                local direct = require "resty.ffi.qrpc.host_direct"
                local sent, refuse = {}, 3
                local fake = { qrpc_submit_async = function(cmd)
                    if refuse > 0 then
                        refuse = refuse - 1
                        return abi.QRPC_ERR_FULL
                    end
                    sent[#sent + 1] = tonumber(cmd.op) .. ":" .. tonumber(cmd.call_id)
                    return abi.QRPC_PENDING
                end }
                direct.init(fake, 0)
                direct.cancel(7, 41)
                direct.cancel(7, 41) -- refused again: still one kept
                local kept = direct.late_cancels()
                direct.retry_cancels() -- refused once more: kept
                local again = direct.late_cancels()
                direct.retry_cancels()
                ngx.say("kept ", kept, ", again ", again, ", sent ", table.concat(sent, ","),
                        ", left ", direct.late_cancels(), ", op ", abi.OP_CANCEL)`)})
	st, body := n.get("/t")
	if st != 200 || body != "kept 1, again 1, sent 5:41, left 0, op 5\n" {
		t.Fatalf("%d %q", st, body)
	}
}
