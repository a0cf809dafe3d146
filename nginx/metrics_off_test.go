package nginx

import (
	"strings"
	"testing"
)

// TestMetricsSwitch: configure{ metrics = false } before the library
// loads keeps the connections dialled next out of qrpc.metrics() (no
// sample at all); metrics = true after it has loaded makes the next
// connection count its calls exactly, while the unrecorded one stays
// unrecorded; a value that is not a boolean is a bad argument.
func TestMetricsSwitch(t *testing.T) {
	t.Parallel()
	srv := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, QServer: srv, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                -- qrpc.metrics(): its sample lines but the bytes totals,
                -- the Lua VMs' completions and the recovered panics (always
                -- there), the bytes sent, and greet's ok count
                local function scrape()
                    local text, err = qrpc.metrics()
                    if not text then
                        return "metrics: " .. tostring(err)
                    end
                    local n = 0
                    for line in text:gmatch("[^\n]+") do
                        if line:sub(1, 1) ~= "#" and not line:find("qrpc_client_bytes_total", 1, true)
                           and not line:find("qrpc_client_vm_completions_total", 1, true)
                           and not line:find("qrpc_client_panics_total", 1, true) then
                            n = n + 1
                        end
                    end
                    local sent = text:match('qrpc_client_bytes_total{direction="sent"} (%d+)')
                    local ok = text:match('qrpc_client_calls_total{method="greet",[^\n]*,result="ok"} (%d+)')
                    return n .. " samples, " .. (tonumber(sent) == 0 and "no" or "some") .. " bytes, greet ok " .. tostring(ok)
                end
                local function calls(conn, k)
                    for _ = 1, k do
                        local res, err = conn:unary("greet", "x")
                        if not res then
                            error("greet: " .. tostring(err))
                        end
                    end
                end
                ngx.say("bad: ", select(2, qrpc.configure{ metrics = "no" }))
                ngx.say("off: ", tostring(qrpc.configure{ metrics = false }))
                -- the library loads here, with recording off
                local off = assert(qt.connect({ timeout = 4001 }))
                calls(off, 5)
                ngx.say("after 5 unrecorded calls: ", scrape())
                ngx.say("on: ", tostring(qrpc.configure{ metrics = true }))
                local on = assert(qt.connect({ timeout = 4002 }))
                calls(on, 3)
                calls(off, 4)
                ngx.say("after 3 recorded and 4 unrecorded: ", scrape())
                ngx.say("stats calls: ", qrpc.stats().calls)`)})
	st, body := n.get("/t")
	if st != 200 {
		t.Fatalf("/t: %d %s", st, body)
	}
	want := lines(
		"bad: bad argument #1: metrics must be true or false (got string)",
		"off: true",
		"after 5 unrecorded calls: 0 samples, no bytes, greet ok nil",
		"on: true",
		// greet's ok line; the rest of the 3 calls' series and the server's
		// gauges are there too: more than one sample (checked below).
		"after 3 recorded and 4 unrecorded: ",
		"stats calls: 12",
	)
	got := strings.Split(body, "\n")
	wl := strings.Split(want, "\n")
	if len(got) != len(wl) {
		t.Fatalf("got:\n%s\nwant:\n%s", body, want)
	}
	for i := range wl {
		if i == 4 {
			if !strings.HasPrefix(got[i], wl[i]) || !strings.HasSuffix(got[i], " samples, some bytes, greet ok 3") || strings.HasPrefix(got[i], wl[i]+"0 ") {
				t.Errorf("line %d: %q, want %q<N> samples, some bytes, greet ok 3", i+1, got[i], wl[i])
			}
			continue
		}
		if got[i] != wl[i] {
			t.Errorf("line %d: %q, want %q", i+1, got[i], wl[i])
		}
	}
}
