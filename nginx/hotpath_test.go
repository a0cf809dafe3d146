package nginx

import (
	"strings"
	"testing"
)

// TestHotPathStaysInC: with the built-in host, unary calls (sequential and
// concurrent, with a timeout and a client-side cancel among them) and
// their completions never make the nginx thread enter Go: the library
// counts the calls into its Go exports (qrpc_go_entries), and the count
// does not move. A thread that has entered Go keeps a Go scheduler slot
// while it runs nginx; the built-in host's GOMAXPROCS default
// of 1 relies on this. Nor does Go call into C on the way (Go's cgo call
// count, qrpc_go_cgo_calls, moves by the timer's few calls only): each
// cgo call after Go was idle would wake its sysmon thread.
func TestHotPathStaysInC(t *testing.T) {
	requireNginx(t)
	if ng.Host() == "resty_ffi" {
		t.Skip("the lua-resty-ffi host has its own hot path")
	}
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local ffi = require "ffi"
                pcall(ffi.cdef, "uint64_t qrpc_go_entries(void);")
                pcall(ffi.cdef, "uint64_t qrpc_go_cgo_calls(void);")
                local lib = ffi.load(qt.lib)
                -- warm: the first call may connect (CONNECT enters Go)
                assert(conn:unary("echo", "warm"))
                local e0 = lib.qrpc_go_entries()
                local bad = 0
                for i = 1, 10 do -- fills hostq.c's lists of small blocks
                    assert(conn:unary("echo", "seq" .. i, { headers = { ["x-i"] = tostring(i) } }))
                end
                local c0 = lib.qrpc_go_cgo_calls()
                for i = 1, 200 do
                    local res = conn:unary("echo", "seq" .. i, { headers = { ["x-i"] = tostring(i) } })
                    if not res or res.body ~= "seq" .. i then bad = bad + 1 end
                end
                -- Go's calls into C meanwhile: the submitter's timer makes
                -- a few every 0.5 s; the old path made three per call.
                local cgo = tonumber(lib.qrpc_go_cgo_calls() - c0)
                local threads = {}
                for j = 1, 20 do
                    threads[j] = ngx.thread.spawn(function()
                        local b = 0
                        for i = 1, 10 do
                            local res = conn:unary("echo", "par" .. j .. ":" .. i)
                            if not res or res.body ~= "par" .. j .. ":" .. i then b = b + 1 end
                        end
                        return b
                    end)
                end
                for j = 1, 20 do
                    local _, b = ngx.thread.wait(threads[j])
                    bad = bad + b
                end
                -- a call that times out in Go, and one cancelled by Lua
                -- when its light thread is killed (the sweep cancels it)
                local _, terr = conn:unary("slow", "1000", { timeout = 50 })
                -- conn:stats() enters Go: each probe's own entries are
                -- counted apart, so every other entry still shows
                local probes = 0
                local function inflight()
                    local p0 = lib.qrpc_go_entries()
                    local st = conn:stats()
                    probes = probes + tonumber(lib.qrpc_go_entries() - p0)
                    return st.inflight
                end
                -- the server holds it 30 s, its timeout is 60 s: only a
                -- cancel ends it within the waits below
                local th = ngx.thread.spawn(function()
                    return conn:unary("slow", "30000", { timeout = 60000 })
                end)
                -- the call is in flight in Go when its thread is killed,
                -- then the dispatcher's sweep (every second) finds it
                -- abandoned and cancels it: Go lets it go
                local reached = qt.wait(10, function() return inflight() > 0 end)
                ngx.thread.kill(th)
                local waiting = require("resty.ffi.qrpc.dispatcher").waiting
                local swept = qt.wait(10, function() return waiting() == 0 end)
                    and qt.wait(10, function() return inflight() == 0 end)
                -- the IPC benchmark's echo makes the same hand-off
                local echo = require("resty.ffi.qrpc.testing").echo
                for i = 1, 50 do
                    if echo("q" .. i) ~= "q" .. i then bad = bad + 1 end
                end
                local e1 = lib.qrpc_go_entries()
                -- an event is written on the nginx thread (qrpc_query)
                local sent = conn:event("echo", "ev")
                local e2 = lib.qrpc_go_entries()
                ngx.say("bad ", bad, " timeout ", terr, " reached ", reached, " swept ", swept,
                        " go entries ", tonumber(e1 - e0) - probes,
                        " cgo calls ", cgo < 40 and "few" or cgo,
                        " event ", sent, " entering Go ", tonumber(e2 - e1) > 0)`)})
	st, body := n.get("/t")
	if st != 200 || body != "bad 0 timeout timeout reached true swept true go entries 0 cgo calls few event true entering Go true\n" {
		t.Fatalf("%d %q", st, strings.TrimSpace(body))
	}
}
