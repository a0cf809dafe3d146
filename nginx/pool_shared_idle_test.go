package nginx

import (
	"strings"
	"testing"
)

// TestPoolSharedIdleStepsStayOutOfGo: the steps Go asks for (here the
// lease holder's renewals of an idle pool) go through the submit queue
// and come back as completions, so the nginx thread does not enter Go for
// them (qrpc_go_entries does not move). A thread that has entered Go
// keeps a Go scheduler slot while it runs nginx, and Go's sysmon then
// watches it for milliseconds: the idle holder's wake-ups.
func TestPoolSharedIdleStepsStayOutOfGo(t *testing.T) {
	requireNginx(t)
	// The lua-resty-ffi host too: it dials through the built-in host
	// (cache.lua), whose dispatcher Go asks for the steps.
	t.Parallel()
	a := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP,
		Extra: map[string]string{"a": a.addr},
		Server: loc("/t", `
                local ffi = require "ffi"
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                pcall(ffi.cdef, "uint64_t qrpc_go_entries(void);")
                local lib = ffi.load(qt.lib)
                local d = ngx.shared.qpools
                -- check every 100 ms: the lease is renewed every 1.6 s
                local conn = assert(qrpc.connect(qt.a, qt.opts({
                    check = { method = "probe", interval = 100 }, shared = "qpools" })))
                assert(conn:unary("echo", "x"))
                local function lease()
                    for _, k in ipairs(d:get_keys(0)) do
                        if k:match(":lp$") then return d:get(k) end
                    end
                end
                local v = qt.wait(5, lease)
                if not v then return ngx.say("no probe lease") end
                local e0 = lib.qrpc_go_entries()
                local renewals = 0
                for _ = 1, 500 do -- at most 10 s
                    local now = lease()
                    if now ~= v then
                        renewals = renewals + 1
                        v = now
                        if renewals == 2 then break end
                    end
                    ngx.sleep(0.02)
                end
                ngx.say("renewals ", renewals, " entries ",
                        tonumber(lib.qrpc_go_entries() - e0))`)})
	code, body := n.get("/t")
	if code != 200 || strings.TrimSpace(body) != "renewals 2 entries 0" {
		t.Fatalf("HTTP %d: %q, want two lease renewals and no entry into Go", code, body)
	}
}
