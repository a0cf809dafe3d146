package nginx

import (
	"strings"
	"testing"
)

// On the lua-resty-ffi host, Go reads a call's command on its own thread,
// after the calling coroutine has yielded (or been killed). Every string
// the command points at must stay reachable until then: the test stands in
// for lua-resty-ffi (its runtime object only; the unit is what the module
// keeps anchored), forces full garbage collections where Go would read the
// task, and looks for each pointer among the values the module keeps.
//
// TestRestyFFIAnchorsEveryOption covers every pointer a unary command
// carries on the lua-resty-ffi host (method,
// body, headers, hash_key, req_type, resp_type and the per-call options
// block), each given alone and as a string made for the call, so that
// nothing but the module can keep it alive: a response type alone, a
// request type with a JSON body, a number hash_key, headers, try_timeout
// and hedge (the options block), a method and a body built per call. A
// forced full collection runs where Go would read the command.
func TestRestyFFIAnchorsEveryOption(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: `
        local ffi = require "ffi"
        local abi = require "resty.ffi.qrpc.abi"
        local rf = require "resty.ffi.qrpc.resty_ffi"
        local pinned
        for i = 1, 64 do
            local name, v = debug.getupvalue(rf.waiting, i)
            if not name then break end
            if name == "pinned" then pinned = v end
        end
        assert(pinned, "resty_ffi.waiting has no upvalue 'pinned'")
        local function holds(v, p)
            if type(v) == "string" then
                return ffi.cast("const char *", v) == p
            end
            if type(v) == "table" then
                for _, x in pairs(v) do
                    if holds(x, p) then return true end
                end
            end
            return false
        end
        local fields = { "method", "body", "hdrs", "hash_key", "req_type", "resp_type", "opts" }
        local rt = {}
        function rt:call(req)
            local c = ffi.cast("const qrpc_cmd_t *", req)
            collectgarbage()
            collectgarbage()
            local set, missing = {}, {}
            for _, f in ipairs(fields) do
                local p = c[f]
                if p ~= nil and tonumber(c[f .. "_len"]) > 0 then
                    set[#set + 1] = f
                    if not holds(pinned, p) then
                        missing[#missing + 1] = f
                    end
                end
            end
            return false, abi.QRPC_ERR, "set=" .. table.concat(set, ",")
                .. " unanchored=" .. table.concat(missing, ",")
        end
        ngx.load_ffi = function() return rt end
        local qt = require "qtest"
        assert(require("resty.ffi.qrpc").configure{ host = "resty_ffi", lib = qt.lib, socket_dir = qt.dir .. "/run" })`,
		Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local k = ngx.var.arg_k
                local hashed = assert(qrpc.connect({ qt.addr, "127.0.0.2:1" }, qt.opts({ balance = "hash" })))
                local conn = assert(qrpc.connect({ qt.addr, "127.0.0.2:1" }, qt.opts()))
                local calls = {
                    { "echo" .. k, "body" .. k, { hash_key = 12345 }, hashed },
                    { "echo", "x", { response = "demo.Reply" .. k } },
                    { "echo", '{"a":' .. k .. '}', { request = "demo.Req" .. k, json = true } },
                    { "echo", "x", { headers = { ["x-" .. k] = "v" .. k } } },
                    { "echo", "x", { try_timeout = 100 + k } },
                    { "echo", "x", { hedge = { delay = 10 + k } } },
                }
                for _, c in ipairs(calls) do
                    local _, err = (c[4] or conn):unary(c[1], c[2], c[3])
                    ngx.say(err)
                end`),
	})
	st, body := n.get("/t?k=7")
	lines := strings.Split(strings.TrimSpace(body), "\n")
	want := []string{"method,body,hash_key", "resp_type", "req_type", "hdrs", "opts", "opts"}
	if st != 200 || len(lines) != len(want) {
		t.Fatalf("%d %q", st, body)
	}
	for i, l := range lines {
		if !strings.Contains(l, "set=") || !strings.Contains(strings.SplitN(l, " ", 2)[0], want[i]) {
			t.Errorf("call %d: %q: want %s among the pointers set", i+1, l, want[i])
		}
		if !strings.HasSuffix(l, " unanchored=") {
			t.Errorf("call %d: %q: a pointer leads into a value nothing keeps", i+1, l)
		}
	}
}
