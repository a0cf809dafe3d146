package nginx

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// block is one Test::Nginx-style case: a config snippet, a request, the
// expected answer.
type block struct {
	name    string
	conf    ngxConf
	path    string // default /t
	method  string // default GET
	reqBody string
	status  int    // default 200
	body    string // exact expected body, unless bodyRe is set
	bodyRe  string
	headers map[string]string // expected response headers (regexps)
	repeat  int               // send the request this many times
	logHas  []string          // regexps that must match a line of error.log
	logNot  []string          // regexps that must match no line
	check   func(t *testing.T, n *nginxProc)
}

func runBlocks(t *testing.T, blocks []block) {
	for _, b := range blocks {
		b := b
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			n := startNginx(t, b.conf)
			runBlock(t, n, b)
		})
	}
}

func runBlock(t *testing.T, n *nginxProc, b block) {
	t.Helper()
	path, method, status := b.path, b.method, b.status
	if path == "" {
		path = "/t"
	}
	if method == "" {
		method = "GET"
	}
	if status == 0 {
		status = 200
	}
	repeat := max(b.repeat, 1)
	for i := 0; i < repeat; i++ {
		st, body, hdr, err := n.do(method, path, b.reqBody)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		if st != status {
			t.Errorf("%s %s: status %d, want %d; body:\n%s", method, path, st, status, body)
		}
		switch {
		case b.bodyRe != "":
			if !regexp.MustCompile(b.bodyRe).MatchString(body) {
				t.Errorf("%s %s: body\n%s\ndoes not match\n%s", method, path, body, b.bodyRe)
			}
		case body != b.body:
			t.Errorf("%s %s: body\n%s\nwant\n%s", method, path, body, b.body)
		}
		for k, re := range b.headers {
			if v := hdr.Get(k); !regexp.MustCompile(re).MatchString(v) {
				t.Errorf("header %s: %q does not match %q", k, v, re)
			}
		}
		if t.Failed() {
			return
		}
	}
	if b.check != nil {
		b.check(t, n)
	}
	for _, re := range b.logHas {
		if n.logCount(re) == 0 {
			t.Errorf("error.log has no line matching %q", re)
		}
	}
	for _, re := range b.logNot {
		if c := n.logCount(re); c > 0 {
			t.Errorf("error.log has %d lines matching %q", c, re)
		}
	}
}

// loc wraps Lua code in a content_by_lua_block location.
func loc(path, lua string) string {
	return "        location = " + path + " {\n            content_by_lua_block {\n" + lua + "\n            }\n        }\n"
}

// connectT is the Lua prologue of most snippets.
const connectT = `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qt.connect()
                if not conn then
                    ngx.say("connect failed: ", err)
                    return
                end
`

func lines(s ...string) string { return strings.Join(s, "\n") + "\n" }

func TestUnary(t *testing.T) {
	runBlocks(t, []block{
		{
			name: "headers",
			conf: ngxConf{Server: loc("/t", connectT+`
                local res, err = conn:unary("greet", "bob", { headers = { ["x-id"] = "7", ["x-n"] = 42 } })
                if not res then ngx.say("unary failed: ", err) return end
                ngx.say(res.code, " ", res.body, " x-id=", res.headers["x-id"], " x-n=", res.headers["x-n"],
                        " greeted=", res.headers["x-greeted"])`)},
			body:   "0 hello, bob x-id=7 x-n=42 greeted=yes\n",
			repeat: 3,
		},
		{
			// Concurrent calls each keep their own headers and body: Lua
			// reuses one header buffer for every call, so the library must
			// be done with it when qrpc_submit_async returns.
			name: "concurrent calls keep their own headers and bodies",
			conf: ngxConf{Server: loc("/t", connectT+`
                local threads = {}
                for i = 1, 300 do
                    threads[i] = ngx.thread.spawn(function()
                        local body = "body-" .. i .. string.rep("x", i * 7)
                        local res, err = conn:unary("echo", body, { headers = { ["x-i"] = tostring(i) } })
                        if not res then return "error " .. tostring(err) end
                        if res.body ~= body or res.headers["x-i"] ~= tostring(i) then
                            return "mismatch " .. i .. ": " .. tostring(res.headers["x-i"])
                        end
                        return "ok"
                    end)
                end
                local bad = {}
                for i = 1, #threads do
                    local _, r = ngx.thread.wait(threads[i])
                    if r ~= "ok" then bad[#bad + 1] = tostring(r) end
                end
                ngx.say(#bad, " bad ", table.concat(bad, ", ", 1, math.min(#bad, 3)))`)},
			body:   "0 bad \n",
			repeat: 3,
		},
		{
			name: "no body no opts",
			conf: ngxConf{Server: loc("/t", connectT+`
                local res, err = conn:unary("echo")
                ngx.say(type(res), " ", res and res.code, " [", res and res.body, "] ", res and next(res.headers))`)},
			body: "table 0 [] nil\n",
		},
		{
			name: "non-zero code is an answer",
			conf: ngxConf{Server: loc("/t", connectT+`
                local res, err = conn:unary("fail", "x")
                ngx.say(type(res), " ", tostring(err), " ", res.code, " ", res.body)
                res, err = conn:unary("no-such-method", "x")
                ngx.say(type(res), " ", tostring(err), " ", res.code, " ", res.body)`)},
			body: lines(`table nil 7 failed on purpose`, `table nil 12 qrpc: unknown method "no-such-method"`),
		},
		{
			name: "large zstd bodies both ways",
			conf: ngxConf{Server: loc("/t", connectT+`
                local body = string.rep("0123456789abcdef", 6400)
                local res, err = conn:unary("echo", body, { timeout = 5000 })
                if not res then ngx.say("echo failed: ", err) return end
                ngx.say(#res.body, " ", res.body == body)
                res, err = conn:unary("big", "102400", { timeout = 5000 })
                if not res then ngx.say("big failed: ", err) return end
                ngx.say(#res.body, " ", ngx.md5(res.body) == res.headers["x-md5"], " ",
                        res.body:sub(1, 12))`)},
			body: lines("102400 true", "102400 true line 0000000"),
		},
		{
			name: "rewrite access content and timer",
			conf: ngxConf{Server: `
        location = /t {
            rewrite_by_lua_block {
                local qt = require "qtest"
                local conn, err = qt.connect()
                local res
                if conn then res, err = conn:unary("greet", "rewrite") end
                ngx.ctx.r = res and res.body or err
            }
            access_by_lua_block {
                local qt = require "qtest"
                local conn, err = qt.connect()
                local res
                if conn then res, err = conn:unary("greet", "access") end
                ngx.ctx.a = res and res.body or err
            }
            content_by_lua_block {
                local qt = require "qtest"
                local dict = ngx.shared.qtest
                local key = "timer-" .. ngx.worker.pid() .. "-" .. ngx.now() .. "-" .. math.random()
                local ok, terr = ngx.timer.at(0, function()
                    local conn, err = qt.connect()
                    local res
                    if conn then res, err = conn:unary("greet", "timer") end
                    dict:set(key, res and res.body or err)
                end)
                if not ok then ngx.say("timer: ", terr) return end
                local conn, err = qt.connect()
                local res
                if conn then res, err = conn:unary("greet", "content") end
                local t = qt.wait(5, function() return dict:get(key) end)
                ngx.say(ngx.ctx.r, "|", ngx.ctx.a, "|", res and res.body or err, "|", t)
            }
        }
`},
			body:   "hello, rewrite|hello, access|hello, content|hello, timer\n",
			repeat: 4,
		},
		{
			name: "timeout",
			conf: ngxConf{Server: loc("/t", connectT+`
                local t0 = ngx.now()
                local res, err = conn:unary("slow", "3000", { timeout = 200 })
                ngx.update_time()
                ngx.say(tostring(res), " ", err, " within 1s: ", ngx.now() - t0 < 1)
                local s = qt.wait(3, function()
                    local s = conn:stats()
                    return s.inflight == 0 and s
                end)
                ngx.say("inflight back to 0: ", s and s.inflight == 0)
                -- the connection's timeout option is the default call timeout
                local c2 = assert(qt.connect({ timeout = 300 }))
                t0 = ngx.now()
                res, err = c2:unary("slow", "3000")
                ngx.update_time()
                ngx.say(tostring(res), " ", err, " within 1s: ", ngx.now() - t0 < 1)
                -- and a call's own timeout wins over it
                res, err = c2:unary("slow", "500", { timeout = 2000 })
                ngx.say(res and res.body or err)`)},
			body: lines("nil timeout within 1s: true", "inflight back to 0: true",
				"nil timeout within 1s: true", "slept 500"),
			// Go enforces the deadline: Lua's safety net never has to.
			logNot: []string{`no completion for call`},
		},
		{
			name: "echo through the library (IPC benchmark path)",
			conf: ngxConf{Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local echo = require("resty.ffi.qrpc.testing").echo
                ngx.say(echo("hello"), " ", #echo(string.rep("x", 100000)))`)},
			body: "hello 100000\n",
		},
		{
			// The built-in host's echo fills one command table for every
			// echo: an empty body, a killed echo, a refused argument and 30
			// light threads at once must each get their own body back
			// (qstream.lua's techo; TestStreamContract runs it in stream).
			name: "testing echo's shared command table: each echo its own body",
			conf: ngxConf{Workers: 1, Server: loc("/t", `
                ngx.say(require("qstream").one("techo"))`)},
			body:   "OK wrong=0 idle=true refused=bad argument #1: body must be a string\n",
			logNot: []string{`echo_many: `},
		},
		{
			// The library reuses large result buffers (internal/bufcache):
			// a buffer handed to two results at once, or reused before Lua
			// copied it out, shows as a body that comes back different. 40
			// light threads echo distinct bodies of 16 KiB to 1.5 MiB (every
			// cached size class, and past the largest) at once; Lua strings
			// are interned, so == compares every byte.
			name: "concurrent echoes of distinct large bodies come back intact",
			conf: ngxConf{Workers: 1, Server: loc("/t", `
                ngx.say(require("qstream").one("echoes 40 12 16384,16385,100000,102400,131072,250000,1048576,1572864"))`)},
			body:   "wrong: 0\n",
			logNot: []string{`echo_many: `},
		},
		{
			// The built-in host cancels the call in Go within about a
			// second; lua-resty-ffi tells nobody, so on that host Go runs
			// it until the server answers (docs/api.md).
			name: "unary from a light thread killed while waiting",
			conf: ngxConf{Workers: 1, Server: loc("/t", connectT+`
                ngx.update_time()
                local t0 = ngx.now()
                local th = ngx.thread.spawn(function()
                    return conn:unary("slow", "5000", { timeout = 10000 })
                end)
                qt.wait(10, function() return conn:stats().inflight == 1 end)
                ngx.say("in flight: ", conn:stats().inflight, " waiting: ", qrpc.stats().waiting)
                ngx.say("killed: ", ngx.thread.kill(th))
                local s = qt.wait(8, function()
                    local s = conn:stats()
                    return s.inflight == 0 and s
                end)
                ngx.update_time()
                local ended = ngx.now() - t0
                if qt.host == "resty_ffi" then
                    ngx.say("inflight back to 0: ", s and s.inflight == 0, " cancelled: ", ended < 4.8)
                else
                    ngx.say("inflight back to 0: ", s and s.inflight == 0, " cancelled: ", ended < 4)
                end
                -- and the connection is still fine
                ngx.say(conn:unary("echo", "still ok").body)`)},
			body: lines("in flight: 1 waiting: 1", "killed: 1",
				fmt.Sprintf("inflight back to 0: true cancelled: %t", ng.Host() != "resty_ffi"), "still ok"),
		},
	})
}

func TestEventsInEveryPhase(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	key := "events-" + t.Name()
	n := startNginx(t, ngxConf{
		Extra: map[string]string{"key": key},
		InitWorkerByLua: `
        local ok, err = ngx.timer.at(0, function()
            local qt = require "qtest"
            local conn, err = qt.connect()
            if not conn then ngx.log(ngx.ERR, "init_worker timer connect: ", err) return end
            local ok, err = conn:event("count", qt.key .. ":init_worker_timer")
            if not ok then ngx.log(ngx.ERR, "init_worker timer event: ", err) end
        end)
        if not ok then ngx.log(ngx.ERR, "timer: ", err) end`,
		Server: `
        location = /t {
            content_by_lua_block {
                local qt = require "qtest"
                local conn, err = qt.connect()
                if not conn then ngx.say("connect failed: ", err) return end
                local ok, err = conn:event("count", qt.key .. ":content", { headers = { phase = "content" } })
                local tok, terr = ngx.timer.at(0, function()
                    local c, e = qt.connect()
                    if not c then ngx.log(ngx.ERR, "timer connect: ", e) return end
                    local ok, e = c:event("count", qt.key .. ":timer")
                    if not ok then ngx.log(ngx.ERR, "timer event: ", e) end
                end)
                ngx.say("content ", tostring(ok), " ", tostring(err), " timer ", tostring(tok), " ", tostring(terr))
            }
            header_filter_by_lua_block {
                local qt = require "qtest"
                -- no yield here: connect returns the connection content_by_lua made
                local conn, err = qt.connect()
                if not conn then ngx.log(ngx.ERR, "header_filter connect: ", err) return end
                local ok, err = conn:event("count", qt.key .. ":header_filter")
                if not ok then ngx.log(ngx.ERR, "header_filter event: ", err) end
            }
            body_filter_by_lua_block {
                if not ngx.arg[2] then return end
                local qt = require "qtest"
                local conn, err = qt.connect()
                if not conn then ngx.log(ngx.ERR, "body_filter connect: ", err) return end
                local ok, err = conn:event("count", qt.key .. ":body_filter")
                if not ok then ngx.log(ngx.ERR, "body_filter event: ", err) end
            }
            log_by_lua_block {
                local qt = require "qtest"
                local conn, err = qt.connect()
                if not conn then ngx.log(ngx.ERR, "log connect: ", err) return end
                local ok, err = conn:event("count", qt.key .. ":log")
                if not ok then ngx.log(ngx.ERR, "log event: ", err) end
            }
        }
        location = /events {
            content_by_lua_block {
                local qt = require "qtest"
                local conn = assert(qt.connect())
                local s = conn:stats()
                ngx.say("events=", s.events, " dropped=", s.dropped)
            }
        }
`})
	const reqs = 10
	for i := 0; i < reqs; i++ {
		if st, body := n.get("/t"); st != 200 || body != "content true nil timer 1 nil\n" {
			t.Fatalf("request %d: %d %q", i, st, body)
		}
	}
	want := map[string]int{
		"content": reqs, "timer": reqs, "header_filter": reqs, "body_filter": reqs, "log": reqs,
		"init_worker_timer": 2, // one per worker
	}
	err := eventually(5*time.Second, func() error {
		for phase, w := range want {
			if got := shared.eventCount(key + ":" + phase); got != w {
				return fmt.Errorf("%s: %d events at the server, want %d", phase, got, w)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	if _, body := n.get("/events"); !regexp.MustCompile(`^events=\d+ dropped=0\n$`).MatchString(body) {
		t.Errorf("/events: %q", body)
	}
}

func TestNonYieldablePhases(t *testing.T) {
	runBlocks(t, []block{
		{
			name: "connect and unary refuse to yield, event works",
			conf: ngxConf{Server: `
        location = /t {
            content_by_lua_block {
                local qt = require "qtest"
                assert(qt.connect())
                ngx.say("ok")
            }
            header_filter_by_lua_block {
                local qt = require "qtest"
                local c, err = qt.connect({ timeout = 1234 }) -- never connected: must dial
                ngx.header["x-connect"] = tostring(c) .. " " .. err
                local conn = assert(qt.connect())
                local res, err = conn:unary("echo", "x")
                ngx.header["x-unary"] = tostring(res) .. " " .. err
                ngx.header["x-event"] = tostring(conn:event("count", "nonyield"))
            }
        }
`},
			body: "ok\n",
			headers: map[string]string{
				"x-connect": `^nil qrpc: cannot connect in the header_filter phase \(connect yields\)`,
				"x-unary":   `^nil qrpc: unary cannot be used in the header_filter phase \(it yields\)`,
				"x-event":   `^true$`,
			},
		},
	})
}

func TestBadArguments(t *testing.T) {
	runBlocks(t, []block{{
		name: "every misuse returns nil, err",
		conf: ngxConf{Server: loc("/t", connectT+`
                local function p(...)
                    local r = { n = select("#", ...), ... }
                    ngx.say(tostring(r[1]), " | ", tostring(r[2]))
                end
                p(conn:unary(123))
                p(conn:unary(nil))
                p(conn:unary("echo", {}))
                p(conn:unary("echo", "x", "opts"))
                p(conn:unary("echo", "x", { timeout = -1 }))
                p(conn:unary("echo", "x", { timeout = "1" }))
                p(conn:unary("echo", "x", { timeout = 0/0 }))
                p(conn:unary("echo", "x", { headers = "h" }))
                p(conn:unary("echo", "x", { headers = { a = true } }))
                p(conn:unary("echo", "x", { headers = { [1] = "v" } }))
                p(conn.unary("echo", "x"))
                p(conn:event(false))
                p(conn:event("count", 5))
                p(conn:event("count", "x", { headers = { k = {} } }))
                p(conn.event({}, "count"))
                p(qrpc.connect(nil))
                p(qrpc.connect(8080))
                p(qrpc.connect("127.0.0.1:1", "opts"))
                p(qrpc.connect("127.0.0.1:1", { tmeout = 5 }))
                p(qrpc.connect("127.0.0.1:1", { timeout = -5 }))
                p(qrpc.connect("127.0.0.1:1", { conns = 0 }))
                p(qrpc.connect("127.0.0.1:1", { conns = 1.5 }))
                p(qrpc.connect("127.0.0.1:1", { cert = "x" }))
                p(qrpc.connect("127.0.0.1:1", { pins = { "nothex" } }))
                p(qrpc.connect("127.0.0.1:1", { pins = "x" }))
                p(qrpc.connect("127.0.0.1:1", { insecure = "yes" }))
                p(qrpc.configure("x"))
                p(qrpc.configure({ host = "other" }))
                p(qrpc.configure({ lbi = "x" }))
                p(require("resty.ffi.qrpc.testing").echo(1))
                -- body over the frame limit
                local small = assert(qt.connect({ max_frame_size = 1024 }))
                p(small:unary("echo", string.rep("x", 2048)))
                p(small:event("count", string.rep("x", 2048)))
                p(small:unary("echo", "fits").body)
                -- a closed connection
                local cc = assert(qt.connect({ timeout = 4321 }))
                p(cc:close())
                p(cc:unary("echo", "x"))
                p(cc:event("count", "x"))
                p(cc:stats())
                p(cc:close())
                -- connect dials again after a close
                local again = assert(qt.connect({ timeout = 4321 }))
                p(again ~= cc, again:unary("echo", "y").body)`)},
		body: lines(
			"nil | bad argument #2: method must be a string (got number)",
			"nil | bad argument #2: method must be a string (got nil)",
			"nil | bad argument #3: body must be a string (got table)",
			"nil | bad argument #4: opts must be a table (got string)",
			"nil | bad argument #4: timeout must be 0..2147483647 ms (got -1)",
			"nil | bad argument #4: timeout must be a number of milliseconds (got string)",
			"nil | bad argument #4: timeout must be a number of milliseconds, not NaN",
			"nil | bad argument #4: headers must be a table (got string)",
			"nil | bad argument #4: header 'a' must be a string (got boolean)",
			"nil | bad argument #4: header names must be strings",
			"nil | bad argument #1: a connection is expected (use conn:method(...), not conn.method(...))",
			"nil | bad argument #2: method must be a string (got boolean)",
			"nil | bad argument #3: body must be a string (got number)",
			"nil | bad argument #4: header 'k' must be a string (got table)",
			"nil | bad argument #1: a connection is expected (use conn:method(...), not conn.method(...))",
			"nil | bad argument #1: addr must be a non-empty string host:port (got nil)",
			"nil | bad argument #1: addr must be a non-empty string host:port (got number)",
			"nil | bad argument #2: opts must be a table (got string)",
			"nil | bad argument #2: unknown option 'tmeout'",
			"nil | bad argument #2: timeout must be 0..2147483647 ms (got -5)",
			"nil | bad argument #2: conns must be 1..64 (got 0)",
			"nil | bad argument #2: conns must be an integer 1..64 (got 1.5)",
			"nil | bad argument #2: cert and key go together",
			"nil | bad argument #2: pins[1] must be a SHA-256 digest in hex (64 digits) or base64 (44 characters)",
			"nil | bad argument #2: pins must be a table (got string)",
			"nil | bad argument #2: insecure must be a boolean (got string)",
			"nil | bad argument #1: opts must be a table (got string)",
			`nil | bad argument #1: host must be "builtin" or "resty_ffi"`,
			"nil | bad argument #1: unknown option 'lbi'",
			"nil | bad argument #1: body must be a string",
			"nil | bad argument #3: body too large (2048 bytes; max_frame_size is 1024)",
			"nil | bad argument #3: body too large (2048 bytes; max_frame_size is 1024)",
			"fits | nil",
			"true | nil",
			"nil | closed",
			"nil | closed",
			"nil | closed",
			"true | nil",
			"true | y",
		),
	}})
}

func TestTLS(t *testing.T) {
	requireNginx(t)
	wrongPin := strings.Repeat("ab", 32)
	runBlocks(t, []block{
		{
			name: "verification failures are connect errors",
			conf: ngxConf{Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function try(opts)
                    local c, err = qrpc.connect(qt.addr, opts)
                    ngx.say(c and "connected" or err)
                end
                try({ ca = qt.other_ca, server_name = "localhost" })
                try({ server_name = "localhost" }) -- system roots
                try({ ca = qt.ca, server_name = "other.example" })
                try({ ca = qt.ca, server_name = "localhost", pins = { "`+wrongPin+`" } })
                try({ ca = qt.ca, server_name = "localhost", pins = { qt.pin_hex } })
                try({ ca = qt.ca, server_name = "localhost", pins = { qt.pin_b64, "`+wrongPin+`" } })
                try({ ca = qt.ca, server_name = "localhost", pins = { "sha256//" .. qt.pin_b64 } })
                try({ ca = qt.ca }) -- SNI from the address: the certificate has IP 127.0.0.1
                try({ insecure = true })`)},
			body: lines(
				"connect: certificate signed by unknown authority",
				"connect: certificate signed by unknown authority",
				"connect: certificate is for another host",
				"connect: certificate pin mismatch",
				"connected", "connected", "connected", "connected", "connected",
			),
		},
		{
			name: "a failed connect is not cached",
			conf: ngxConf{Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                for i = 1, 2 do
                    local c, err = qrpc.connect(qt.addr, { ca = qt.other_ca, server_name = "localhost" })
                    ngx.say(tostring(c), " ", err)
                end
                ngx.say("connections: ", qrpc.stats().connections)`)},
			body: lines("nil connect: certificate signed by unknown authority",
				"nil connect: certificate signed by unknown authority", "connections: 0"),
		},
	})
}

func TestMTLS(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	srv, err := newTestServer("127.0.0.1:0", ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.close() })
	n := startNginx(t, ngxConf{QServer: srv, Server: loc("/t", `
                local qt = require "qtest"
                local function try(extra)
                    local conn, err = qt.connect(extra)
                    if not conn then return ngx.say("connect: ", err) end
                    local res, err = conn:unary("greet", "mtls", { timeout = 2000 })
                    ngx.say(res and res.body or ("call: " .. err))
                end
                try({ timeout = 2000 })
                try({ cert = qt.cert, key = qt.key })`)})
	st, body := n.get("/t")
	// Without a certificate the server refuses: at the handshake, or (TLS
	// 1.3 lets the client finish first) on the first call.
	re := regexp.MustCompile(`^(connect: connect: (client certificate required by server|tls handshake failed)|call: (connection lost|unavailable|closed)[^\n]*)\nhello, mtls\n$`)
	if st != 200 || !re.MatchString(body) {
		t.Fatalf("%d %q does not match %s", st, body, re)
	}
}

func TestInitPhase(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	var n *nginxProc
	n = startNginx(t, ngxConf{
		InitByLua: `
        local qrpc = require "resty.ffi.qrpc"
        local qt = require "qtest"
        local ok, err = qrpc.configure{ lib = qt.lib, socket_dir = qt.dir .. "/run" }
        local c, cerr = qrpc.connect("127.0.0.1:1")
        local e, eerr = require("resty.ffi.qrpc.testing").echo("x")
        package.loaded.init_result = table.concat({ tostring(ok), tostring(err), tostring(c),
            cerr, tostring(e), eerr, "loaded=" .. tostring(qrpc.stats().loaded) }, "\n")`,
		Server: loc("/t", connectT+`
                ngx.say(package.loaded.init_result)
                ngx.say(conn:unary("echo", "worker ok").body)`),
	})
	st, body := n.get("/t")
	want := lines("true", "nil", "nil",
		"qrpc: not available in the init phase (the Go runtime must load in workers: call it from a worker phase)",
		"nil",
		"qrpc: not available in the init phase (the Go runtime must load in workers: call it from a worker phase)",
		"loaded=false", "worker ok")
	if st != 200 || body != want {
		t.Fatalf("%d\n%s\nwant\n%s", st, body, want)
	}
	// The master never mapped the library (a Go runtime does not survive fork).
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", n.masterPID()))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(maps), "libffi_qrpc") {
		t.Error("the nginx master has libffi_qrpc.so mapped")
	}
	loaded := 0
	for _, pid := range n.workerPIDs() {
		if m, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); err == nil && strings.Contains(string(m), "libffi_qrpc") {
			loaded++
		}
	}
	if loaded == 0 {
		t.Error("no worker has libffi_qrpc.so mapped after a call")
	}
}

func TestLibrarySearch(t *testing.T) {
	requireNginx(t)
	runBlocks(t, []block{
		{
			name: "not found names every place it looked",
			conf: ngxConf{InitByLua: " ", Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                assert(qrpc.configure{ lib = "/nonexistent/libffi_qrpc.so" })
                local c, err = qrpc.connect(qt.addr)
                ngx.say(err)
                assert(qrpc.configure{ socket_dir = qt.dir .. "/run" })
                c, err = qrpc.connect(qt.addr)
                ngx.say(err)`)},
			bodyRe: `^qrpc: cannot load /nonexistent/libffi_qrpc.so: .*No such file.*\n` +
				`qrpc: libffi_qrpc.so not found; looked in: /tmp/qng-[^/]+/lua/libffi_qrpc.so, ` +
				`/tmp/qng-[^/]+/libffi_qrpc.so, /tmp/qng-[^/]+/lib/libffi_qrpc.so, .*/usr/local/lib/libffi_qrpc.so, ` +
				`/usr/local/openresty/lualib/libffi_qrpc.so, the dynamic linker's path \(LD_LIBRARY_PATH, .*\); ` +
				`set qrpc.configure\{ lib = "/path/to/libffi_qrpc.so" \}\n$`,
		},
		{
			name: "found through LD_LIBRARY_PATH",
			conf: ngxConf{
				EnvNames: []string{"LD_LIBRARY_PATH"}, ProcEnv: []string{"LD_LIBRARY_PATH=" + libDir},
				InitByLua: " ",
				Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                assert(qrpc.configure{ socket_dir = qt.dir .. "/run" })
                local conn, err = qt.connect()
                if not conn then ngx.say(err) return end
                ngx.say(conn:unary("echo", "found").body, " ", qrpc.stats().lib)
                ngx.say(tostring(qrpc.configure{ lib = "/elsewhere.so" }))
                ngx.say(tostring(qrpc.configure{ socket_dir = qt.dir .. "/run" }))`)},
			body: lines("found ffi_qrpc", "nil", "true"),
		},
	})
}

// procLoop runs one process API (?api=exec|popen|pipe) ?n times in the
// request's worker and prints how many rounds failed. os.execute must
// report the child's exit status (Lua 5.1: the wait status 768; LuaJIT
// with Lua 5.2 compat, as OpenResty builds it: nil, "exit", 3); io.popen
// must read the child's line; ngx.pipe (OpenResty's nginx only) must read
// the line and wait must report the exit code. A round that loses its
// child (reaped by a SIGCHLD handler running on a Go thread) fails; lost
// pipes wait for their 2 s timeouts, so after 5 of them the rest count as
// lost without trying.
const procLoop = `
                local qt = require "qtest"
                local api, N = ngx.var.arg_api, tonumber(ngx.var.arg_n)
                local bad, tried, first = 0, 0, nil
                if api == "exec" then
                    tried = N
                    for i = 1, N do
                        local a, b, c = os.execute("exit 3")
                        local ok
                        if qt.lua52_exec then
                            ok = a == nil and b == "exit" and c == 3
                        else
                            ok = a == 768
                        end
                        if not ok then
                            bad = bad + 1
                            first = first or (tostring(a) .. " " .. tostring(b) .. " " .. tostring(c))
                        end
                    end
                elseif api == "popen" then
                    tried = N
                    for i = 1, N do
                        local f = io.popen("echo popen " .. i)
                        local line = f and f:read("*l")
                        if line ~= "popen " .. i then
                            bad = bad + 1
                            first = first or tostring(line)
                        end
                        -- pclose's status is not checked: nginx's own SIGCHLD
                        -- handler may reap the child first, with or without Go.
                        if f then f:close() end
                    end
                elseif api == "pipe" then
                    local ok, pipe = pcall(require, "ngx.pipe")
                    if not ok then
                        ngx.say("unsupported")
                        return
                    end
                    for i = 1, N do
                        if bad >= 5 then bad = bad + N - i + 1 break end
                        tried = i
                        local proc, err = pipe.spawn({ "sh", "-c", "echo pipe $1; exit 2", "sh", tostring(i) })
                        local line, ok, reason, status
                        if proc then
                            proc:set_timeouts(2000, 2000, 2000, 2000)
                            line, err = proc:stdout_read_line()
                            ok, reason, status = proc:wait()
                        end
                        if line ~= "pipe " .. i or ok ~= false or reason ~= "exit" or status ~= 2 then
                            bad = bad + 1
                            first = first or table.concat({ tostring(line), tostring(err), tostring(ok),
                                                            tostring(reason), tostring(status) }, " ")
                        end
                    end
                end
                ngx.say(bad, " ", tried, first and (" first: " .. first) or "")`

// procRounds is how many times each process API runs after the library is
// loaded; requests run procChunk of them at a time, so that each stays
// well under the HTTP client's timeout on a loaded machine (a fork and
// exec of sh took 145 ms there).
const (
	procRounds = 200
	procChunk  = 25
)

// procRun sends the rounds of every API through path and returns the
// failures per API ("exec", "popen", "pipe"); a pipe count of -1 means
// this nginx has no ngx.pipe. It logs how many rounds were tried and lost.
func procRun(t *testing.T, n *nginxProc, path string, rounds int) map[string]int {
	t.Helper()
	failed, tried, lost := map[string]int{}, map[string]int{}, map[string]int{}
	defer func() {
		t.Logf("%s: rounds lost/tried (pipes after 5 lost in a request are not tried): exec %d/%d, popen %d/%d, pipe %d/%d",
			path, lost["exec"], tried["exec"], lost["popen"], tried["popen"], lost["pipe"], tried["pipe"])
	}()
	for _, api := range []string{"exec", "popen", "pipe"} {
		for done := 0; done < rounds; done += procChunk {
			st, body := n.get(fmt.Sprintf("%s?api=%s&n=%d", path, api, min(procChunk, rounds-done)))
			if st != 200 {
				t.Fatalf("%s %s: %d %q", path, api, st, body)
			}
			if body == "unsupported\n" {
				failed[api] = -1
				break
			}
			var c, tr int
			if _, err := fmt.Sscanf(body, "%d %d", &c, &tr); err != nil {
				t.Fatalf("%s %s: %q", path, api, body)
			}
			tried[api] += tr
			lost[api] += c - (min(procChunk, rounds-done) - tr)
			if c > 0 && failed[api] == 0 {
				t.Logf("%s %s: %s", path, api, strings.TrimSpace(body))
			}
			failed[api] += c
		}
	}
	return failed
}

// TestPipeAndExecAfterLoad: after the library is loaded and a call made,
// os.execute, io.popen and ngx.pipe (where the nginx has it) still see
// their children, procRounds times each. Go keeps SIGCHLD unblocked on its
// threads, so nginx's SIGCHLD handler would otherwise run there and reap
// them (golang/go#55066, openresty/openresty#1022), and ngx_lua's signalfd
// (which needs SIGCHLD blocked and pending) would never see them; the
// library forwards signals that land on its threads to nginx's thread.
func TestPipeAndExecAfterLoad(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/control", procLoop) + loc("/t", connectT+`
                if not conn:unary("echo", "loaded") then ngx.say("call failed") return end`+procLoop)})
	// The same APIs before Go is loaded: what nginx alone does here.
	pipeWant := 0
	if !ng.Pipe {
		pipeWant = -1
	}
	want := map[string]int{"exec": 0, "popen": 0, "pipe": pipeWant}
	if got := procRun(t, n, "/control", procChunk); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("before loading the library, failures: %v, want %v", got, want)
	}
	if _, body := n.get("/stats"); !strings.Contains(body, "loaded=false") {
		t.Fatalf("the library is loaded before the test loads it: %s", body)
	}
	start := time.Now()
	got := procRun(t, n, "/t", procRounds)
	t.Logf("%s: %d rounds of os.execute, io.popen and ngx.pipe (%v) after loading Go in %v; failures %v",
		ng.Flavour, procRounds, ng.Pipe, time.Since(start).Round(time.Millisecond), got)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after loading the library and a call, failures: %v, want %v", got, want)
	}
	if _, body := n.get("/stats"); !strings.Contains(body, "loaded=true") {
		t.Errorf("the library is not loaded: %s", body)
	}
	// The mechanism, not just its symptom: in the worker that loaded Go,
	// every thread but nginx's own blocks nginx's process signals (Go
	// insists on keeping SIGCHLD unblocked: that one is checked above).
	for _, pid := range n.workerPIDs() {
		goThreads, unblocked := threadSignalMasks(t, pid)
		if goThreads == 0 {
			t.Errorf("worker %d has no threads besides nginx's: Go is not loaded?", pid)
		}
		if len(unblocked) > 0 {
			t.Errorf("worker %d: threads that do not block nginx's signals: %v", pid, unblocked)
		}
	}
}

// TestPipeAndExecWithoutForwarding is the negative control of
// TestPipeAndExecAfterLoad: the same rounds with the library's signal
// forwarders off (QRPC_NO_SIGNAL_FORWARD=1, passed with env). It fails if
// no child is lost, since it would then show nothing about the forwarders.
func TestPipeAndExecWithoutForwarding(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{
		Workers:  1,
		EnvNames: []string{"QRPC_NO_SIGNAL_FORWARD"}, ProcEnv: []string{"QRPC_NO_SIGNAL_FORWARD=1"},
		Server: loc("/t", connectT+`
                if not conn:unary("echo", "loaded") then ngx.say("call failed") return end`+procLoop),
		// ngx.pipe's wait gives up on the children it never hears of.
		AllowErrors: []string{`lua pipe`},
	})
	got := procRun(t, n, "/t", procRounds)
	t.Logf("%s without the signal forwarders, failures in %d rounds: %v", ng.Flavour, procRounds, got)
	lost := 0
	for _, c := range got {
		lost += max(c, 0)
	}
	if lost == 0 {
		t.Errorf("no child was lost without the signal forwarders: the control shows nothing")
	}
}

// ngxSignalsMask are nginx's process signals other than SIGCHLD: HUP, INT,
// QUIT, USR1, USR2, ALRM, TERM, WINCH, IO (bit n-1 for signal n).
const ngxSignalsMask = 1<<0 | 1<<1 | 1<<2 | 1<<9 | 1<<11 | 1<<13 | 1<<14 | 1<<27 | 1<<28

// threadSignalMasks returns how many threads besides the main one pid has,
// and those of them that do not block all of ngxSignalsMask.
func threadSignalMasks(t *testing.T, pid int) (int, []string) {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var others int
	var unblocked []string
	for _, task := range tasks {
		if task.Name() == strconv.Itoa(pid) {
			continue
		}
		others++
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			continue // exited meanwhile
		}
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "SigBlk:"); ok {
				mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err != nil || mask&ngxSignalsMask != ngxSignalsMask {
					unblocked = append(unblocked, task.Name()+":"+strings.TrimSpace(v))
				}
			}
		}
	}
	return others, unblocked
}

func TestHostSelection(t *testing.T) {
	requireNginx(t)
	runBlocks(t, []block{
		{
			name: "lua-resty-ffi present but unusable falls back to the built-in host",
			conf: ngxConf{
				InitByLua: `
        local qt = require "qtest"
        ngx.load_ffi = function() return nil, -1 end
        assert(require("resty.ffi.qrpc").configure{ lib = qt.lib, socket_dir = qt.dir .. "/run" })`,
				Server: loc("/t", connectT+`
                ngx.say(conn:unary("echo", "fallback").body, " ", qrpc.stats().host)`)},
			body:   "fallback builtin\n",
			logHas: []string{`qrpc: lua-resty-ffi unusable \(libffi_init failed: -1\); using the built-in host`},
		},
		{
			name: "resty_ffi asked for without lua-resty-ffi",
			conf: ngxConf{
				InitByLua: `
        local qt = require "qtest"
        ngx.load_ffi = nil -- an nginx with lua-resty-ffi has defined it
        assert(require("resty.ffi.qrpc").configure{ host = "resty_ffi", lib = qt.lib, socket_dir = qt.dir .. "/run" })`,
				Server: loc("/t", `
                local qt = require "qtest"
                local c, err = qt.connect()
                ngx.say(tostring(c), " ", err)`)},
			body: "nil qrpc: host resty_ffi: ngx.load_ffi is missing (lua-resty-ffi is not loaded)\n",
		},
	})
}

func TestInitWorker(t *testing.T) {
	runBlocks(t, []block{{
		name: "init_worker loads the library and starts the dispatcher",
		conf: ngxConf{InitWorkerByLua: `
        local qrpc = require "resty.ffi.qrpc"
        local ok, err = qrpc.init_worker()
        if not ok then ngx.log(ngx.ERR, "init_worker: ", err) end`},
		path:   "/stats",
		bodyRe: `^pid=\d+ loaded=true host=` + ng.Host() + ` inflight=0 waiting=0 connections=0 dispatcher=true\n$`,
		repeat: 4,
	}})
}

// restyFFICalls is what TestRestyFFIHost runs through the lua-resty-ffi
// host; fake adds the stand-in's own checks.
func restyFFICalls(fake bool) string {
	lua := connectT + `
                ngx.say("host: ", qrpc.stats().host)
                local res, err = conn:unary("greet", "ffi", { headers = { ["x-id"] = "9" } })
                ngx.say(res.code, " ", res.body, " ", res.headers["x-id"], " ", res.headers["x-greeted"])
                res = conn:unary("fail", "x")
                ngx.say(res.code, " ", res.body)
                local big = string.rep("0123456789abcdef", 6400)
                res = conn:unary("echo", big, { timeout = 5000 })
                ngx.say(#res.body, " ", res.body == big)
                local t0 = ngx.now()
                res, err = conn:unary("slow", "3000", { timeout = 200 })
                ngx.update_time()
                ngx.say(tostring(res), " ", err, " within 1s: ", ngx.now() - t0 < 1)
                ngx.say("event: ", tostring(conn:event("count", "resty_ffi")))
                ngx.say("echo: ", require("resty.ffi.qrpc.testing").echo("via the task queue"))
                local threads = {}
                for i = 1, 20 do
                    threads[i] = ngx.thread.spawn(function()
                        local r, e = conn:unary("echo", "t" .. i)
                        return r and r.body or e
                    end)
                end
                local good = 0
                for i = 1, 20 do
                    local _, body = ngx.thread.wait(threads[i])
                    if body == "t" .. i then good = good + 1 end
                end
                ngx.say("threads: ", good)
                local c2, cerr = qrpc.connect(qt.addr, { ca = qt.other_ca, server_name = "localhost" })
                ngx.say(tostring(c2), " ", cerr)
                local c3 = assert(qt.connect({ timeout = 2222 }))
                ngx.say("close: ", tostring(c3:close()))
                ngx.say(tostring(c3:unary("echo", "x")), " ", select(2, c3:unary("echo", "x")))`
	if fake {
		lua += `
                local fake = require "fake_resty_ffi"
                ngx.say("tasks answered once: ", fake.bad_answers == 0, " tasks: ", fake.tasks > 20)`
	}
	return lua
}

var restyFFIWant = []string{
	"host: resty_ffi",
	"0 hello, ffi 9 yes",
	"7 failed on purpose",
	"102400 true",
	"nil timeout within 1s: true",
	"event: true",
	"echo: via the task queue",
	"threads: 20",
	"nil connect: certificate signed by unknown authority",
	"close: true",
	"nil closed",
}

// TestRestyFFIHost drives the lua-resty-ffi host of the Lua module: on
// every nginx through a stand-in for lua-resty-ffi (testdata/
// fake_resty_ffi.*, same contract), and on the resty-ffi flavour through
// the real one too (where every other test also runs on that host).
func TestRestyFFIHost(t *testing.T) {
	requireNginx(t)
	var blocks []block
	if shimPath != "" {
		blocks = append(blocks, block{
			name: "calls through the stand-in's task queue",
			conf: ngxConf{
				InitByLua: `
        local qt = require "qtest"
        require("fake_resty_ffi").install(qt.shim)
        assert(require("resty.ffi.qrpc").configure{ lib = qt.lib, socket_dir = qt.dir .. "/run" })`,
				Server: loc("/t", restyFFICalls(true))},
			body: lines(append(restyFFIWant, "tasks answered once: true tasks: true")...),
			// Go's own log lines reach error.log with this host too.
			logHas: []string{`qrpc: connect failed addr=127\.0\.0\.1:\d+ err=`},
		})
	} else {
		t.Logf("lua-resty-ffi stand-in unavailable: %v", shimErr)
	}
	if ng.RestyFFILib != "" {
		blocks = append(blocks, block{
			name: "calls through real lua-resty-ffi",
			// The default init_by_lua: require "resty_ffi", host = "resty_ffi".
			conf:   ngxConf{Server: loc("/t", restyFFICalls(false))},
			body:   lines(restyFFIWant...),
			logHas: []string{`qrpc: connect failed addr=127\.0\.0\.1:\d+ err=`, `qrpc: loaded .* \(host resty_ffi\)`},
		})
	}
	if len(blocks) == 0 {
		t.Skip("neither the stand-in nor lua-resty-ffi")
	}
	runBlocks(t, blocks)
}

func TestEventQueueFull(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	srv, err := newTestServerCfg("127.0.0.1:0", nil, qrpc.ServerConfig{MaxHandlers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.release(); _ = srv.close() })
	n := startNginx(t, ngxConf{QServer: srv, Workers: 1, Server: loc("/t", `
                local qt = require "qtest"
                -- one stream, so that one stuck stream is the whole connection
                local conn = assert(qt.connect({ streams = 1 }))
                -- incompressible, so that zstd does not shrink it
                local chunk = {}
                for i = 1, 1024 * 1024 do chunk[i] = string.char(math.random(0, 255)) end
                local body = table.concat(chunk)
                local sent, refused
                for i = 1, 200 do
                    local ok, err = conn:event("block", body)
                    if not ok then refused = err break end
                    sent = i
                end
                ngx.say("refused: ", refused, " after ", sent and sent > 1, " dropped: ", conn:stats().dropped)`)})
	st, body := n.get("/t")
	if st != 200 || body != "refused: queue full after true dropped: 1\n" {
		t.Fatalf("%d %q", st, body)
	}
}

func TestConnectFailures(t *testing.T) {
	requireNginx(t)
	// A UDP port nobody listens on.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().String()
	_ = pc.Close()
	runBlocks(t, []block{{
		name: "unreachable and malformed addresses",
		conf: ngxConf{Extra: map[string]string{"dead": dead}, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local t0 = ngx.now()
                local c, err = qrpc.connect(qt.dead, qt.opts({ timeout = 500 }))
                ngx.update_time()
                ngx.say(tostring(c), " [", err, "] bounded: ", ngx.now() - t0 < 2)
                c, err = qrpc.connect("no-port-here", qt.opts())
                ngx.say(tostring(c), " [", err, "]")
                -- .invalid never resolves (RFC 6761)
                c, err = qrpc.connect("qrpc-test.invalid:8443", qt.opts({ timeout = 2000 }))
                ngx.say(tostring(c), " [", err, "]")`)},
		// A closed port: its host answers ICMP port unreachable, which the
		// client's socket hears: refused at once (docs/api.md, Errors).
		bodyRe: `^nil \[connect: refused\] bounded: true\nnil \[bad argument #1: addr must be host:port \(got "no-port-here"\)\]\nnil \[connect: cannot resolve host\]\n$`,
	}})
}
