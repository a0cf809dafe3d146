package nginx

import (
	"strconv"
	"strings"
	"testing"
)

// TestCallDeadline: a per-call deadline (ngx.now()'s clock) bounds the
// call's timeout; a call past it is not sent (timeout, no attempt,
// counted in qrpc_client_deadline_expired_total); propagate_deadline (per
// connection or per call) sends the time left as grpc-timeout.
func TestCallDeadline(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect(qt.addr, qt.opts({ timeout = 10000 })))
                -- the deadline cuts a 10 s timeout: the 2 s handler times out first
                local t0 = ngx.now()
                local res, err, info = conn:unary("slow", "2000", { deadline = ngx.now() + 0.2 })
                ngx.update_time()
                ngx.say("cut: ", err, " ", ngx.now() - t0 < 1.5)
                -- already passed: not sent
                res, err, info = conn:unary("echo", "x", { deadline = ngx.now() - 1 })
                ngx.say("past: ", err, " ", info.attempts, " ", info.detail)
                -- time left to the server, per call and per connection
                res = assert(conn:unary("echo", "x", { deadline = ngx.now() + 5, propagate_deadline = true,
                                                       headers = { ["x-a"] = "1" } }))
                ngx.say("per call: ", res.headers["grpc-timeout"], " ", res.headers["x-a"])
                local pc = assert(qrpc.connect(qt.addr, qt.opts({ timeout = 3000, propagate_deadline = true })))
                res = assert(pc:unary("echo", "x"))
                ngx.say("per connection: ", res.headers["grpc-timeout"], " ", pc ~= conn)
                res = assert(conn:unary("echo", "x"))
                ngx.say("off: ", tostring(res.headers["grpc-timeout"]))
                for _, bad in ipairs({ "soon", 0/0, true }) do
                    ngx.say(select(2, conn:unary("echo", "x", { deadline = bad })))
                end
                ngx.say(select(2, conn:event("notify", "x", { deadline = ngx.now() + 1 })))`) +
		loc("/metrics", `ngx.print(require("resty.ffi.qrpc").metrics())`)})
	st, body := n.get("/t")
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if st != 200 || len(lines) != 9 {
		t.Fatalf("/t: %d\n%s", st, body)
	}
	want := []string{"cut: timeout true", "past: timeout 0 the deadline passed ", "per call: ", "per connection: 3000m true", "off: nil",
		"bad argument #4: deadline must be a number of seconds on ngx.now()'s clock (got string)",
		"bad argument #4: deadline must be a number of seconds on ngx.now()'s clock (got ",
		"bad argument #4: deadline must be a number of seconds on ngx.now()'s clock (got boolean)",
		"bad argument #4: option 'deadline' does not apply to events"}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want it to start with %q", i, lines[i], w)
		}
	}
	// per call: a deadline 5 s away: at most 5000m, more than 4000m
	f := strings.Fields(lines[2])
	if len(f) != 4 || !strings.HasSuffix(f[2], "m") || f[3] != "1" {
		t.Fatalf("per call: %q, want grpc-timeout and the caller's header", lines[2])
	}
	ms, err := strconv.Atoi(strings.TrimSuffix(f[2], "m"))
	if err != nil || ms > 5000 || ms < 4000 {
		t.Errorf("per call: grpc-timeout %q, want 4000..5000m", f[2])
	}
	_, m := n.get("/metrics")
	if !strings.Contains(m, `qrpc_client_deadline_expired_total{method="echo"} 1`) {
		t.Errorf("metrics do not count the expired call:\n%s", grepLines(m, "expired"))
	}
}
