package nginx

import (
	"io"
	"net/http"
	"testing"
)

// TestPropagate: opts.propagate copies the request's headers into each
// call's headers unless the caller set them; in a timer nothing is copied.
func TestPropagate(t *testing.T) {
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect(qt.addr, qt.opts({ propagate = { "traceparent", "X-Request-Id", "tracestate" } })))
                local res = assert(conn:unary("echo", "x", { headers = { ["x-request-id"] = "mine" } }))
                ngx.say(res.headers.traceparent, " ", res.headers["x-request-id"], " ", tostring(res.headers.tracestate))
                local done
                ngx.timer.at(0, function()
                    local r = assert(conn:unary("echo", "x"))
                    done = tostring(r.headers.traceparent)
                end)
                qt.wait(5, function() return done end)
                ngx.say("timer: ", done)`) + loc("/bad", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local c, err = qrpc.connect(qt.addr, qt.opts({ propagate = "traceparent" }))
                ngx.say(tostring(c), " ", err)`)})
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	req, err := http.NewRequest("GET", n.url("/t"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Traceparent", tp)
	req.Header.Set("X-Request-Id", "theirs")
	resp, err := n.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := tp + " mine nil\ntimer: nil\n"; string(b) != want {
		t.Fatalf("got %q, want %q", b, want)
	}
	if st, body := n.get("/bad"); st != 200 || body != "nil bad argument #2: propagate must be a table (got string)\n" {
		t.Fatalf("bad propagate: %d %q", st, body)
	}
}
