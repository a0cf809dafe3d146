package nginx

// Claims of docs/api.md a reader checked from outside and found broken:
// each test failed before its fix.

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// api.md: propagate_deadline sends the time left as grpc-timeout in
// gRPC's format, at most 8 digits and a unit: whole ms below 10^8, whole
// seconds (rounded up) from there. The timeouts of 10^8 ms and more came
// out as 9 and 10 digits of ms.
func TestPropagateDeadlineGRPCFormat(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qt = require "qtest"
                local conn = assert(qt.connect())
                for _, ms in ipairs({ 99999999, 100000000, 100000001, 2147483647 }) do
                    local res = assert(conn:unary("echo", "x", { propagate_deadline = true, timeout = ms }))
                    ngx.say(res.headers["grpc-timeout"])
                end
                local c2 = assert(qt.connect({ propagate_deadline = true, timeout = 2147483647 }))
                ngx.say(assert(c2:unary("echo", "x")).headers["grpc-timeout"])`)})
	_, body := n.get("/t")
	if got, want := strings.Fields(body), []string{"99999999m", "100000S", "100001S", "2147484S", "2147484S"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("grpc-timeout values %q, want %q", got, want)
	}
}

// api.md: "A value out of range gives ... (got <value>); NaN and ±infinity
// give ... must be a number (of milliseconds), not NaN (or inf, -inf)".
// The pools' options said "(got nan)", "(got inf)", a string's contents as
// if a number, ">= 0 (got 10000000000)", or no value at all.
func TestPoolOptionNumberMessages(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qt.connect())
                local function say(_, err) ngx.say(err) end
                say(conn:unary("echo", "x", { try_timeout = 0/0 }))
                say(conn:unary("echo", "x", { try_timeout = 1/0 }))
                say(conn:unary("echo", "x", { try_timeout = 1e10 }))
                say(conn:unary("echo", "x", { try_timeout = -5 }))
                say(conn:unary("echo", "x", { try_timeout = "10" }))
                say(conn:unary("echo", "x", { retries = 0/0 }))
                say(conn:unary("echo", "x", { retries = "1" }))
                say(conn:unary("echo", "x", { retries = 17 }))
                say(qrpc.connect(qt.addr, qt.opts({ resolve = 0/0 })))
                say(qrpc.connect(qt.addr, qt.opts({ resolve = -1 })))
                say(qrpc.connect(qt.addr, qt.opts({ health = { eject = 0/0 } })))
                say(qrpc.connect(qt.addr, qt.opts({ health = { eject = 0 } })))
                say(qrpc.connect(qt.addr, qt.opts({ health = { stall = -1 } })))
                say(qrpc.connect(qt.addr, qt.opts({ check = { method = "echo", interval = -1/0 } })))
                say(qrpc.connect(qt.addr, qt.opts({ budget = { ratio = 0/0 } })))
                say(qrpc.connect(qt.addr, qt.opts({ budget = { ratio = 1/0 } })))
                say(qrpc.connect(qt.addr, qt.opts({ budget = { ratio = "0.5" } })))
                say(qrpc.connect(qt.addr, qt.opts({ budget = { min_per_s = 1/0 } })))
                say(qrpc.connect(qt.addr, qt.opts({ health = { failures = 0/0 } })))
                say(qrpc.connect(qt.addr, qt.opts({ health = { failures = "3" } })))
                say(conn:unary("echo", "x", { hedge = { delay = 0/0 } }))
                say(conn:unary("echo", "x", { hedge = { delay = 5, max = 1/0 } }))
                say(conn:unary("echo", "x", { hedge = { delay = 5, max = "2" } }))`)})
	_, body := n.get("/t")
	want := []string{
		"bad argument #4: try_timeout must be a number of milliseconds, not NaN",
		"bad argument #4: try_timeout must be a number of milliseconds, not inf",
		"bad argument #4: try_timeout must be at most 2147483647 ms (got 10000000000)",
		"bad argument #4: try_timeout must be a number of milliseconds >= 0 (got -5)",
		"bad argument #4: try_timeout must be a number of milliseconds (got string)",
		"bad argument #4: retries must be a number, not NaN",
		"bad argument #4: retries must be an integer 0..16 (got string)",
		"bad argument #4: retries must be an integer 0..16 (got 17)",
		"bad argument #2: resolve must be a number of milliseconds, not NaN",
		"bad argument #2: resolve must be a number of milliseconds >= 0 (got -1)",
		"bad argument #2: health.eject must be a number of milliseconds, not NaN",
		"bad argument #2: health.eject must be a number of milliseconds > 0 (got 0)",
		"bad argument #2: health.stall must be a number of milliseconds >= 0 (got -1)",
		"bad argument #2: check.interval must be a number of milliseconds, not -inf",
		"bad argument #2: budget.ratio must be a number 0..1, not NaN",
		"bad argument #2: budget.ratio must be a number 0..1, not inf",
		"bad argument #2: budget.ratio must be a number 0..1 (got string)",
		"bad argument #2: budget.min_per_s must be a number, not inf",
		"bad argument #2: health.failures must be a number, not NaN",
		"bad argument #2: health.failures must be an integer 1..2147483647 (got string)",
		"bad argument #4: hedge.delay must be a number of milliseconds, not NaN",
		"bad argument #4: hedge.max must be a number, not inf",
		"bad argument #4: hedge.max must be an integer 1..4 (got string)",
	}
	got := strings.Split(strings.TrimSpace(body), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("messages:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// api.md: unary "returns nil, "qrpc: unary cannot be used in the <phase>
// phase (it yields) ..." elsewhere". A call with a past deadline in the
// log phase returns "timeout" instead (and counts an expired call in
// qrpc_client_deadline_expired_total for a call that could never be made).
func TestLogPhaseExpiredDeadline(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, HTTP: "lua_shared_dict ha 1m;", Server: `
        location = /t {
            content_by_lua_block {
                local qt = require "qtest"
                assert(qt.connect())
                ngx.say("ok")
            }
            log_by_lua_block {
                local qt = require "qtest"
                local c = assert(qt.connect())
                local _, e1 = c:unary("echo", "x")
                local _, e2 = c:unary("echo", "x", { deadline = 1 })
                ngx.shared.ha:set("r", tostring(e1) .. "\n" .. tostring(e2))
            }
        }
` + loc("/r", `ngx.say(ngx.shared.ha:get("r"))`)})
	n.get("/t")
	var body string
	// the log phase runs after the answer
	testwait.Until(t, "the log phase's results", 5*time.Second, func() bool {
		_, body = n.get("/r")
		return !strings.HasPrefix(body, "nil")
	})
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if len(lines) != 2 {
		t.Fatalf("/r: %q", body)
	}
	if !strings.HasPrefix(lines[1], "qrpc: unary cannot be used in the log phase") {
		t.Errorf("log phase, past deadline: %q, want the phase error (%q without a deadline)", lines[1], lines[0])
	}
}

// api.md: header values "are strings (numbers are converted)"; hash_key "(a
// number is converted)". LuaJIT's tostring keeps 14 digits: an integer
// header such as a microsecond timestamp arrives rounded, in e notation.
func TestNumericHeadersExact(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qt = require "qtest"
                local conn = assert(qt.connect())
                local res = assert(conn:unary("echo", "x", { headers = { ["x-ts"] = 1733580000123456, ["x-n"] = 2^53,
                    ["x-r"] = 1733580000000000, ["x-b"] = 2^60, ["x-f"] = 0.1, ["x-m"] = -1e15, ["x-t"] = 2^63 } }))
                local h = res.headers
                ngx.say(h["x-ts"], " ", h["x-n"], " ", h["x-r"], " ", h["x-b"], " ", h["x-f"], " ", h["x-m"], " ", h["x-t"])`)})
	_, body := n.get("/t")
	// a round integer too: its short form (1.73358e+15) reads back, but a
	// server reading an integer id or a timestamp wants digits
	want := "1733580000123456 9007199254740992 1733580000000000 1152921504606846976 0.1 -1000000000000000 9223372036854775808"
	if strings.TrimSpace(body) != want {
		t.Errorf("numeric headers arrived as %q, want %q", strings.TrimSpace(body), want)
	}
}

// pools.md: a retry goes to another server when one can take it, else
// back to one it tried: a one-server connection with retries = 2 and a
// try_timeout its server passes runs the call three times there, and says
// so in info.attempts (the docs said "on another server" only).
func TestOneServerRetriesOnIt(t *testing.T) {
	var count atomic.Int64
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	srv.Handle("count", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		count.Add(1)
		ms, _ := strconv.Atoi(string(req.Body))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
		}
	})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"counter": a.String()}, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local c = assert(qrpc.connect(qt.counter, qt.opts()))
                local res, err, info = c:unary("count", "2000", { timeout = 3000, try_timeout = 100, retries = 2 })
                ngx.say(err, " ", info.attempts)`)})
	_, body := n.get("/t")
	if got := strings.TrimSpace(body); got != "timeout 3" {
		t.Errorf("one-server connection, retries = 2: %q, want \"timeout 3\"", got)
	}
	// the third attempt may reach the server's handler after the answer
	if !testwait.For(5*time.Second, func() bool { return count.Load() >= 3 }) || count.Load() != 3 {
		t.Errorf("the server ran the call %d times, want 3", count.Load())
	}
}

// api.md: connect's full checks refuse a pins value that is not a list of
// strings ("pins must be a list of strings"); a connect that finds a
// cached connection checks only names and boolean types. A sparse pins
// list ({ [2] = pin }) is refused on a fresh connect, but accepted, and its
// pin silently dropped, once a connection made with pins = {} is cached.
func TestPinsCheckedWithCachedConn(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local wrong = string.rep("0", 64)
                local c1, e1 = qt.connect({ conns = 2, pins = { [2] = wrong } })
                assert(qt.connect({ conns = 2, pins = {} }))
                local c2, e2 = qt.connect({ conns = 2, pins = { [2] = wrong } })
                ngx.say(tostring(e1), "\n", tostring(e2))`)})
	_, body := n.get("/t")
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if len(lines) != 2 || lines[0] != lines[1] {
		t.Errorf("the same bad pins, fresh then cached: %q", lines)
	}
}

// api.md: propagate_deadline "send[s] the time left to the server as the
// header grpc-timeout". A caller's own "GRPC-Timeout" header stays beside
// it: two grpc-timeout headers, differing in case, with different values.
func TestPropagateDeadlineOneHeader(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qt = require "qtest"
                local conn = assert(qt.connect())
                local res = assert(conn:unary("echo", "x", { propagate_deadline = true, headers = { ["GRPC-Timeout"] = "1S" } }))
                local n = 0
                for k in pairs(res.headers) do if k:lower() == "grpc-timeout" then n = n + 1 end end
                ngx.say(n)`)})
	_, body := n.get("/t")
	if strings.TrimSpace(body) != "1" {
		t.Errorf("grpc-timeout headers sent: %s, want 1", strings.TrimSpace(body))
	}
}
