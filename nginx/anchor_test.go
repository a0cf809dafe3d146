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
// task, and looks for each pointer among the values the module keeps. A
// number hash_key becomes a fresh string that nothing else holds.
func TestRestyFFIAnchorsEveryPointer(t *testing.T) {
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
        local fields = { "method", "body", "hdrs", "hash_key", "req_type", "resp_type" }
        local rt = {}
        function rt:call(req)
            local c = ffi.cast("const qrpc_cmd_t *", req)
            if c.op == abi.OP_CONNECT then
                return true, "\1\0\0\0\0\0\0\0" -- handle 1
            end
            collectgarbage()
            collectgarbage()
            local missing = {}
            for _, f in ipairs(fields) do
                local p = c[f]
                if p ~= nil and tonumber(c[f .. "_len"]) > 0 and not holds(pinned, p) then
                    missing[#missing + 1] = f
                end
            end
            return false, abi.QRPC_ERR, "unanchored=" .. table.concat(missing, ",")
        end
        ngx.load_ffi = function() return rt end
        local qt = require "qtest"
        assert(require("resty.ffi.qrpc").configure{ host = "resty_ffi", lib = qt.lib, socket_dir = qt.dir .. "/run" })`,
		Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qrpc.connect({ qt.addr, "127.0.0.2:1" }, qt.opts({ balance = "hash" }))
                if not conn then ngx.say("connect: ", err) return end
                local _, e1 = conn:unary("echo", "body", { hash_key = 12345, headers = { ["x-a"] = "b" } })
                local _, e2 = conn:unary("echo", "body", { hash_key = "key" .. ngx.var.arg_k })
                ngx.say(e1, " | ", e2)`),
	})
	st, body := n.get("/t?k=7")
	if st != 200 || strings.Count(body, "unanchored=") != 2 || strings.Contains(body, "unanchored=,") ||
		!strings.HasSuffix(strings.TrimSpace(body), "unanchored=") {
		t.Fatalf("%d %q: every pointer of the command must lead into a value the module keeps", st, body)
	}
	for _, part := range strings.Split(strings.TrimSpace(body), " | ") {
		if !strings.HasSuffix(part, "unanchored=") {
			t.Errorf("%q: a pointer leads into a value nothing keeps", part)
		}
	}
}
