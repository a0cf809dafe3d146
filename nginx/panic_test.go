package nginx

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// panicKinds: each kind of goroutine of the library that a test build
// can make panic in the middle of its work (safego.Inject), what the
// call that meets the panic must get (err, "" for an answer), and
// whether the kind runs on this host. The Lua side (panicLua) makes the
// call that drives that kind of goroutine.
var panicKinds = []struct {
	where string
	err   string
	host  string // "" for both
}{
	// between the in-flight counts and qrpc's Start
	{"submitter", "internal error", ""},
	// holding an answered call, other calls of the stream pending
	{"stream reader", "internal error", ""},
	// holding a frame of a 3 MB request that waits for flow control
	{"stream writer", "internal error", ""},
	// holding a call whose deadline passed
	{"deadline timer", "internal error", ""},
	// holding a connection it has just dialled (a new pool's first)
	{"redial", "", ""},
	// dialling a new pool
	{"connect", "internal error", ""},
	// closing a connection with a call in flight: the call hears
	// "closed", not its timeout
	{"close", "closed", ""},
	// probing the server of a call in flight: the call still answers
	{"probe timer", "", ""},
	// owing the dispatcher a wake byte for an answer
	{"waker", "", "builtin"},
	// holding a task taken from lua-resty-ffi's queue
	{"lua-resty-ffi poll loop", "internal error", "resty_ffi"},
	// a pool's hedge timer, about to send a copy of a slow call: the
	// first copy still answers
	{"pool hedge timer", "", ""},
	// a pool's active check of a server; the pool's calls go on
	{"pool probe", "", ""},
	// a pool's re-resolution round; the next round resolves
	{"pool resolver", "", ""},
	// a shared pool's timer that publishes a burst's throttling window
	{"pool share timer", "", ""},
	// draining a server DNS took out of a pool: it is closed all the
	// same; the pool's calls go on
	{"pool drain", "", ""},
	// watching the process of another worker that holds a shared pool's
	// lease (here the test's own process): the lease's end takes over
	{"pool share watch", "", ""},
}

// panicLua arms one panic of the kind in ?where= (qrpc_test_arm, in the
// test build of the library), makes the call that drives that goroutine
// and prints what it got, then what the worker looks like after it.
const panicLua = `
                local ffi = require "ffi"
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                pcall(ffi.cdef, "void qrpc_test_arm(const char *where, int n); int qrpc_test_armed(const char *where);")
                local lib = ffi.load(qt.lib)
                local where = ngx.unescape_uri(ngx.var.arg_where)
                -- a pool of its own per kind (its timeout is the key), so
                -- that connect and redial meet a first dial
                local opts = qt.opts({ timeout = 4000 + tonumber(ngx.var.arg_n) })
                local addr = qt.addr
                if where == "pool hedge timer" then
                    opts.hedge = { delay = 20, max = 1 }
                elseif where == "pool probe" then
                    opts.check = { method = "echo", interval = 100 }
                elseif where == "pool resolver" then
                    addr = addr:gsub("^127%.0%.0%.1:", "localhost:")
                    opts.resolve = 100
                elseif where == "pool share timer" then
                    opts.shared = "qpanic"
                    opts.throttle = { k = 2, codes = { 7 } }
                elseif where == "pool share watch" then
                    -- a probe lease held by another live process: the
                    -- pool's first step starts watching it, armed
                    opts.shared = { dict = "qpanic", name = "watch" }
                    opts.check = { method = "echo", interval = 1000 }
                    ngx.shared.qpanic:set(qt.watchlease,
                        qt.otherpid .. "-00 9000000000000000000", 60)
                    lib.qrpc_test_arm(where, 1)
                elseif where == "pool drain" then
                    -- the test's own DNS server answers two addresses,
                    -- then (after "arm") one
                    addr = qt.name
                    opts.resolve = 100
                    opts.resolver = qt.dns
                end
                local conn, err
                if where ~= "connect" then
                    conn = assert(qrpc.connect(addr, opts))
                    if ngx.var.arg_phase ~= "after" then
                        assert(conn:unary("echo", "warm"))
                    end
                end
                if ngx.var.arg_phase ~= "after" and where ~= "pool share watch" then
                    lib.qrpc_test_arm(where, 1)
                end
                if ngx.var.arg_phase == "arm" then
                    return ngx.say("armed")
                end
                local res
                if where == "connect" then
                    conn, err = qrpc.connect(qt.addr, opts)
                    if not conn then
                        conn = assert(qrpc.connect(qt.addr, opts))
                    end
                elseif where == "redial" then
                    -- the server restarted since "arm": the connection
                    -- comes back, after the panic of its first re-dial
                    res = qt.wait(20, function()
                        local r, e = conn:unary("echo", "x")
                        err = e
                        return r
                    end)
                    if res then
                        err = nil
                    end
                elseif where == "pool hedge timer" then
                    res, err = conn:unary("slow", "300", { timeout = 5000 })
                elseif where == "pool probe" or where == "pool resolver"
                       or where == "pool share timer" or where == "pool drain"
                       or where == "pool share watch" then
                    -- the pool's own goroutine meets the panic; its calls
                    -- go on
                    res, err = conn:unary("echo", "x")
                    qt.wait(10, function()
                        return lib.qrpc_test_armed(where) == 0
                    end)
                    if where == "pool drain" and not qt.wait(10, function()
                        return #conn:peers() == 1
                    end) then
                        err = "the drained server is still listed"
                    end
                elseif where == "probe timer" then
                    res, err = conn:unary("slow", "300", { timeout = 5000 })
                elseif where == "deadline timer" then
                    res, err = conn:unary("slow", "3000", { timeout = 100 })
                elseif where == "stream writer" then
                    -- incompressible (zstd would shrink a repeated one
                    -- under the stream's flow-control window): the frame
                    -- waits for credit, in the writer's queue
                    local chunks = {}
                    for i = 1, 3 * 1024 do
                        local c = {}
                        for j = 1, 1024 do
                            c[j] = math.random(0, 255)
                        end
                        chunks[i] = string.char(unpack(c))
                    end
                    res, err = conn:unary("echo", table.concat(chunks), { timeout = 5000 })
                elseif where == "close" then
                    local th = ngx.thread.spawn(function()
                        return conn:unary("slow", "5000", { timeout = 10000 })
                    end)
                    qt.wait(10, function() return conn:stats().inflight == 1 end)
                    conn:close()
                    local _, r, e = ngx.thread.wait(th)
                    res, err = r, e
                    conn = assert(qrpc.connect(qt.addr, opts))
                elseif where == "stream reader" then
                    -- calls pending on the connection while the reader
                    -- that panics holds one of them
                    local ths = {}
                    for i = 1, 8 do
                        ths[i] = ngx.thread.spawn(function()
                            return conn:unary("slow", "300", { timeout = 5000 })
                        end)
                    end
                    res, err = conn:unary("echo", "x")
                    for i = 1, 8 do
                        ngx.thread.wait(ths[i])
                    end
                else
                    res, err = conn:unary("echo", "x")
                end
                ngx.say("pid=", ngx.worker.pid())
                ngx.say("err=", err or "")
                ngx.say("armed=", lib.qrpc_test_armed(where))
                local after, aerr = conn:unary("echo", "after")
                ngx.say("after=", after and after.body or aerr)
                -- the snapshot that found both at 0: a later one can
                -- count a log line of the pool's on its way (queued)
                local s
                local drained = qt.wait(10, function()
                    s = qrpc.stats()
                    return s.inflight == 0 and s.queued == 0
                end)
                ngx.say("inflight=", s.inflight, " queued=", s.queued, " drained=", tostring(drained))
                local m = assert(qrpc.metrics())
                local pat = ('qrpc_client_panics_total{where="' .. where .. '"} '):gsub("%p", "%%%0")
                ngx.say("metric=", m:match(pat .. "(%d+)") or "none")
`

// TestPanicsDoNotTakeNginxDown: a panic injected into each kind of the
// library's goroutines, in the middle of its work, in turn in one worker:
// the worker lives on (its pid unchanged), the call that met the panic
// gets the documented error (internal error, or the answer when nothing
// of the call was lost), the next call answers, nothing stays counted in
// flight or queued, the panic is logged once with its stack and counted
// in qrpc_client_panics_total{where}.
func TestPanicsDoNotTakeNginxDown(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	srv := ownServer(t)
	// "pool drain": a second server on 127.0.0.2 at the same port, and a
	// name the test's own DNS server answers with both, then one.
	_, port, _ := net.SplitHostPort(srv.addr)
	second, err := newTestServer("127.0.0.2:"+port, nil)
	if err != nil {
		t.Fatalf("no server on 127.0.0.2:%s: %v", port, err)
	}
	t.Cleanup(func() { _ = second.close() })
	const name = "drain.qrpc.test."
	dns := dnstest.Start(t, name)
	dns.Set("127.0.0.1", "127.0.0.2")
	n := startNginx(t, ngxConf{Workers: 1, Hooks: true, QServer: srv, Server: loc("/inject", panicLua),
		HTTP: "lua_shared_dict qpanic 1m;\n",
		Extra: map[string]string{"name": "drain.qrpc.test:" + port, "dns": dns.Addr,
			"otherpid": strconv.Itoa(os.Getpid()),
			// the probe lease of the pool named "watch" with this one address
			"watchlease": "qrpc:n:watch:lp" + qrpc.ShareScope([]string{srv.addr})},
		AllowErrors: []string{`qrpc: panic recovered where=`}})
	pid := ""
	for i, k := range panicKinds {
		if k.host != "" && k.host != ng.Host() {
			continue
		}
		t.Run(k.where, func(t *testing.T) {
			path := fmt.Sprintf("/inject?n=%d&where=%s", i, strings.ReplaceAll(k.where, " ", "%20"))
			if k.where == "redial" {
				// armed, then the connection lost: the server restarts
				if code, body := n.get(path + "&phase=arm"); code != 200 || body != "armed\n" {
					t.Fatalf("arm: HTTP %d: %s", code, body)
				}
				if err := srv.restart(0); err != nil {
					t.Fatal(err)
				}
				path += "&phase=after"
			}
			if k.where == "pool drain" {
				// armed with both servers up, then DNS takes one out
				if code, body := n.get(path + "&phase=arm"); code != 200 || body != "armed\n" {
					t.Fatalf("arm: HTTP %d: %s", code, body)
				}
				dns.Set("127.0.0.1")
				path += "&phase=after"
			}
			code, body := n.get(path)
			if code != 200 {
				t.Fatalf("HTTP %d: %s\n%s", code, body, tail(n.errorLog(), 30))
			}
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
				key, val, _ := strings.Cut(line, "=")
				got[key] = val
			}
			if pid == "" {
				pid = got["pid"]
			}
			if got["pid"] != pid {
				t.Errorf("worker pid %s, was %s: the worker died", got["pid"], pid)
			}
			if got["err"] != k.err {
				t.Errorf("the call that met the panic: err %q, want %q", got["err"], k.err)
			}
			if got["armed"] != "0" {
				t.Errorf("the panic did not happen (%s still armed)", got["armed"])
			}
			if got["after"] != "after" {
				t.Errorf("the next call: %q", got["after"])
			}
			if got["inflight"] != "0 queued=0 drained=true" {
				t.Errorf("after the panic: inflight=%s", got["inflight"])
			}
			if got["metric"] != "1" {
				t.Errorf(`qrpc_client_panics_total{where=%q} %s, want 1`, k.where, got["metric"])
			}
			// once, with its stack; the clean-up after it did not panic
			quoted := regexp.QuoteMeta(k.where)
			if strings.Contains(k.where, " ") {
				quoted = `"` + quoted + `"`
			}
			if c := n.logCount(`qrpc: panic recovered where=` + quoted + ` panic=.* stack="[^"]*\.go:\d+`); c != 1 {
				t.Errorf("%d log lines of the panic with a stack, want 1:\n%s", c, tail(n.errorLog(), 20))
			}
			if c := n.logCount(`where="?` + regexp.QuoteMeta(k.where) + ` cleanup`); c != 0 {
				t.Errorf("the clean-up after the panic panicked:\n%s", tail(n.errorLog(), 20))
			}
		})
	}
}
