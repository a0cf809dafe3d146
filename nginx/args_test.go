package nginx

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArgumentChecks: out-of-range, NaN and infinite options are refused in
// Lua with the range the option takes, before a command is built, so that
// Go's "bad command: ..." never reaches a caller; arguments that would make
// the library throw are refused too.
func TestArgumentChecks(t *testing.T) {
	runBlocks(t, []block{{
		name: "connect, unary and event options",
		conf: ngxConf{Server: loc("/t", connectT+`
                local function p(...)
                    local r = { ... }
                    ngx.say(tostring(r[1]), " | ", tostring(r[2]))
                end
                local inf = math.huge
                local function c(o) return qrpc.connect(qt.addr, qt.opts(o)) end
                p(c({ conns = 65 }))
                p(c({ conns = 0 }))
                p(c({ conns = 1.5 }))
                p(c({ conns = 0/0 }))
                p(c({ streams = 1025 }))
                p(c({ streams = 0 }))
                p(c({ stream_batch = 0 }))
                p(c({ stream_batch = 1025 }))
                p(c({ stream_batch = 2.5 }))
                p(c({ max_frame_size = 63 }))
                p(c({ max_frame_size = 1073741825 }))
                p(c({ idle_timeout = -1 }))
                p(c({ idle_timeout = 0/0 }))
                p(c({ timeout = -5 }))
                p(c({ timeout = 0/0 }))
                p(c({ timeout = inf }))
                p(c({ timeout = -inf }))
                p(c({ timeout = 2147483648 }))
                p(qrpc.connect(":8443"))
                p(conn:unary("", "x"))
                p(conn:event("", "x"))
                p(conn:unary("echo", "x", { timeout = 0/0 }))
                p(conn:unary("echo", "x", { timeout = inf }))
                p(conn:unary("echo", "x", { timeout = -1 }))
                -- more headers than the library takes (each entry fits)
                local many = {}
                for i = 1, 32769 do many["h" .. i] = "" end
                p(conn:unary("echo", "x", { headers = many }))
                p(conn:event("count", "x", { headers = many }))
                -- the limits themselves are accepted
                local edge = assert(c({ conns = 64, streams = 1024, stream_batch = 1024, idle_timeout = 0,
                                        max_frame_size = 64, timeout = 2147483647 }))
                p(edge:event("count", "x"))
                p(conn:unary("echo", "longest", { timeout = 2147483647 }).body)`)},
		body: lines(
			"nil | bad argument #2: conns must be 1..64 (got 65)",
			"nil | bad argument #2: conns must be 1..64 (got 0)",
			"nil | bad argument #2: conns must be an integer 1..64 (got 1.5)",
			"nil | bad argument #2: conns must be a number, not NaN",
			"nil | bad argument #2: streams must be 1..1024 (got 1025)",
			"nil | bad argument #2: streams must be 1..1024 (got 0)",
			"nil | bad argument #2: stream_batch must be 1..1024 (got 0)",
			"nil | bad argument #2: stream_batch must be 1..1024 (got 1025)",
			"nil | bad argument #2: stream_batch must be an integer 1..1024 (got 2.5)",
			"nil | bad argument #2: max_frame_size must be 64..1073741824 (got 63)",
			"nil | bad argument #2: max_frame_size must be 64..1073741824 (got 1073741825)",
			"nil | bad argument #2: idle_timeout must be 0..2147483647 ms (got -1)",
			"nil | bad argument #2: idle_timeout must be a number of milliseconds, not NaN",
			"nil | bad argument #2: timeout must be 0..2147483647 ms (got -5)",
			"nil | bad argument #2: timeout must be a number of milliseconds, not NaN",
			"nil | bad argument #2: timeout must be a number of milliseconds, not inf",
			"nil | bad argument #2: timeout must be a number of milliseconds, not -inf",
			"nil | bad argument #2: timeout must be 0..2147483647 ms (got 2147483648)",
			`nil | bad argument #1: addr must be host:port, the host is empty (got ":8443")`,
			"nil | bad argument #2: method must not be empty",
			"nil | bad argument #2: method must not be empty",
			"nil | bad argument #4: timeout must be a number of milliseconds, not NaN",
			"nil | bad argument #4: timeout must be a number of milliseconds, not inf",
			"nil | bad argument #4: timeout must be 0..2147483647 ms (got -1)",
			"nil | bad argument #4: too many headers (32769; at most 32768)",
			"nil | bad argument #4: too many headers (32769; at most 32768)",
			"true | nil",
			"longest | nil",
		),
	}, {
		// Arguments whose metamethods raise, and values of the wrong kind
		// (cdata, userdata), give "bad argument", never an error thrown out
		// of the library.
		name: "metamethods that raise",
		conf: ngxConf{Server: loc("/t", connectT+`
                local ffi = require "ffi"
                local function p(f, ...)
                    local ok, r1, r2 = pcall(f, ...)
                    if not ok then
                        ngx.say("THREW: ", tostring(r1))
                        return
                    end
                    -- the message's position prefix depends on the snippet
                    ngx.say(tostring(r1), " | ", (string.gsub(tostring(r2), "content_by_lua%b():%d+: ", "")))
                end
                local function boom() error("boom") end
                local function raising() return setmetatable({}, { __index = boom }) end
                local key = setmetatable({}, { __tostring = boom })
                p(qrpc.connect, qt.addr, raising())
                p(qrpc.connect, qt.addr, { [key] = 1 })
                p(qrpc.connect, qt.addr, setmetatable({}, { __index = function() error({}) end }))
                p(conn.unary, conn, "echo", "x", raising())
                p(conn.event, conn, "count", "x", raising())
                p(qrpc.configure, raising())
                p(qrpc.configure, { [key] = 1 })
                p(conn.unary, conn, ffi.new("int", 1))
                p(conn.unary, conn, "echo", ffi.new("char[1]"))
                p(conn.event, conn, "count", "x", { headers = { k = ffi.new("int", 1) } })
                p(qrpc.connect, newproxy and newproxy() or ffi.new("int", 1))
                -- a metatable that only supplies values (no error): read through it
                local defaults = setmetatable({}, { __index = qt.opts({ timeout = 1234 }) })
                local c1 = assert(qrpc.connect(qt.addr, defaults))
                local c2 = assert(qt.connect({ timeout = 1234 }))
                p(function() return c1 == c2, c1:unary("echo", "via __index", setmetatable({}, { __index = { timeout = 2000 } })).body end)`)},
		body: lines(
			"nil | bad argument #2: opts raised an error: boom",
			"nil | bad argument #2: option names must be strings (got table)",
			"nil | bad argument #2: opts raised an error: (a table)",
			"nil | bad argument #4: opts raised an error: boom",
			"nil | bad argument #4: opts raised an error: boom",
			"nil | bad argument #1: opts raised an error: boom",
			"nil | bad argument #1: option names must be strings (got table)",
			"nil | bad argument #2: method must be a string (got cdata)",
			"nil | bad argument #3: body must be a string (got cdata)",
			"nil | bad argument #4: header 'k' must be a string (got cdata)",
			"nil | bad argument #1: addr must be a non-empty string host:port (got userdata)",
			"true | via __index",
		),
	}})
}

// TestHeaderLimits: headers over the connection's max_frame_size are
// refused in Lua before they are packed, and a huge header block does not
// leave the worker holding a buffer its size.
func TestHeaderLimits(t *testing.T) {
	runBlocks(t, []block{{
		name: "too large headers",
		conf: ngxConf{Server: loc("/t", `
                local qt = require "qtest"
                local small = assert(qt.connect({ max_frame_size = 1024 }))
                local h = { headers = { a = string.rep("x", 2000) } }
                local function p(res, err, info) ngx.say(tostring(res), " | ", err, " | ", info.detail) end
                p(small:unary("echo", "x", h))
                p(small:event("count", "x", h))
                -- under the limit: 8 + 1 + 900 bytes packed
                local res = assert(small:unary("echo", "x", { headers = { a = string.rep("y", 900) } }))
                ngx.say(res.body)`)},
		body: lines(
			"nil | too large: request exceeds max_frame_size | headers (2009 bytes; max_frame_size is 1024)",
			"nil | too large: request exceeds max_frame_size | headers (2009 bytes; max_frame_size is 1024)",
			"x",
		),
	}, {
		name: "the header buffer shrinks back",
		conf: ngxConf{Workers: 1, Server: loc("/t", connectT+`
                -- Each full cycle also halves LuaJIT's own string buffer,
                -- which string.rep grew to 4 MiB: six bring it under 64 KiB.
                local function kb()
                    for _ = 1, 6 do collectgarbage("collect") end
                    return collectgarbage("count")
                end
                assert(conn:unary("echo", "warm", { headers = { a = "b" } }))
                local before = kb()
                -- in a function of its own: a block's dead locals may stay
                -- on the stack, its frame does not
                local function big()
                    local opts = { headers = { a = string.rep("z", 4 * 1024 * 1024) } }
                    local res, err = conn:unary("echo", "big", opts)
                    ngx.say("big: ", res and res.body or err)
                end
                big()
                local after = kb()
                -- a shared buffer kept at its largest size would stay at 8 MiB
                ngx.say("kept under 1 MiB: ", after - before < 1024, " (", math.floor(after - before), " KiB)")
                assert(conn:unary("echo", "small", { headers = { a = "b" } }))`)},
		bodyRe: `^big: big\nkept under 1 MiB: true \(-?\d+ KiB\)\n$`,
	}})
}

// TestUnusableSocketDir: a socket_dir the workers cannot use fails the
// first call at once with the reason, logs it once, and every later call
// fails the same way at once (no slow polling path).
func TestUnusableSocketDir(t *testing.T) {
	requireNginx(t)
	ro, err := os.MkdirTemp("", "qrpc-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(ro) })
	// Not writable by the workers: nobody under a root suite, the owner
	// otherwise.
	if err := os.Chmod(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(ro, "missing")
	snippet := `
                local qt = require "qtest"
                local qrpc = require "resty.ffi.qrpc"
                for i = 1, 3 do
                    ngx.update_time()
                    local t0 = ngx.now()
                    local c, err = qt.connect()
                    ngx.update_time()
                    -- the first round loads the library (Go's runtime
                    -- starts): seconds on a loaded CI machine
                    ngx.say(tostring(c), " | ", err, " | fast: ", ngx.now() - t0 < (i == 1 and 5 or 0.3))
                end
                local ok, err = qrpc.init_worker()
                ngx.say(tostring(ok), " | ", err)`
	for _, tc := range []struct{ name, dir, reason string }{
		{"not writable", ro, "permission denied"},
		{"missing", missing, "no such file or directory"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			// The wake-up socket is the built-in host's: on an nginx with
			// lua-resty-ffi calls do not need it (only Go's log lines do).
			init := "        assert(require(\"resty.ffi.qrpc\").configure{ host = \"builtin\", lib = [[" + libPath + "]], socket_dir = [[" + tc.dir + "]] })"
			want := `nil \| qrpc: socket_dir ` + regexp.QuoteMeta(tc.dir) + `: listen unix [^|]*: ` + tc.reason + ` \| fast: true\n`
			runBlock(t, startNginx(t, ngxConf{
				Workers:     1,
				InitByLua:   init,
				Server:      loc("/t", snippet),
				AllowErrors: []string{`qrpc: socket_dir `},
			}), block{
				bodyRe: "^" + want + want + want + `nil \| qrpc: socket_dir [^\n]*` + tc.reason + "\n$",
				check: func(t *testing.T, n *nginxProc) {
					if c := n.logCount(`\[error\].*qrpc: socket_dir `); c != 1 {
						t.Errorf("%d error.log lines about socket_dir, want 1:\n%s", c, n.errorLog())
					}
				},
			})
		})
	}
}

// TestAddressChecksRemembered: connect remembers the lone addresses it has
// checked (the checks are string patterns LuaJIT does not compile, about
// 1 us of every connect), at most 1024 of them; a bad address is refused
// every time, and pool options are still checked for a remembered address.
func TestAddressChecksRemembered(t *testing.T) {
	runBlocks(t, []block{{
		name: "remembered, bounded",
		conf: ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local pool = require "resty.ffi.qrpc.pool"
                local a = pool.check(qt.addr, {})
                ngx.say(a == pool.check(qt.addr, {}), " ", pool.checked(qt.addr))
                ngx.say(select(2, qrpc.connect(qt.addr, qt.opts({ balance = "nope" }))))
                for i = 1, 3000 do
                    assert(pool.check("h" .. i .. ":1", {}))
                end
                local n = pool.lone_count()
                ngx.say(n > 0 and n <= 1024)
                ngx.say(select(2, qrpc.connect("nohost")))
                ngx.say(select(2, qrpc.connect(":8443")))
                ngx.say(conn == qrpc.connect(qt.addr, qt.opts()))`)},
		body: lines(
			"true true",
			`bad argument #2: balance must be "round_robin", "least_inflight", "hash" or "p2c" (got nope)`,
			"true",
			`bad argument #1: addr must be host:port (got "nohost")`,
			`bad argument #1: addr must be host:port, the host is empty (got ":8443")`,
			"true",
		),
	}})
}
