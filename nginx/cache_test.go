package nginx

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// TestKilledConnectWaiterFreesRoom: with max_connections = 1, a light
// thread killed while it waits for a connect another thread carries
// does not pin the connection: once idle it is closed to make room for a
// connect to another server, which used to fail "too many connections"
// for the rest of the worker's life.
func TestKilledConnectWaiterFreesRoom(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	srv := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, QServer: srv, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                assert(qrpc.configure{ max_connections = 1 })
                local o = qt.opts({ timeout = 3001 })
                local a = ngx.thread.spawn(function() return qrpc.connect(qt.addr, o) end)
                -- finds the entry connecting, and waits for a's dial
                local b = ngx.thread.spawn(function() return qrpc.connect(qt.addr, o) end)
                assert(ngx.thread.kill(b))
                local _, conn, err = ngx.thread.wait(a)
                assert(conn, err)
                assert(conn:unary("echo", "first"))
                local other, oerr = qrpc.connect(qt.shared_addr, qt.opts({ timeout = 3002 }))
                if not other then
                    return ngx.say("second server: ", oerr)
                end
                assert(other:unary("echo", "second"))
                local _, cerr = conn:unary("echo", "again")
                ngx.say("second server connected; the first ", cerr or "still open")`)})
	if code, body := n.get("/t"); code != 200 || body != "second server connected; the first closed\n" {
		t.Fatalf("HTTP %d: %q", code, body)
	}
}

// TestMaxConnectionsCountsServers: max_connections caps QUIC connections,
// servers × conns: a pool of a name with three addresses counts three
// once it is up (it was one), and follows its re-resolution.
func TestMaxConnectionsCountsServers(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	first, port, dns := threeServersByName(t, "cap.qrpc.test.")
	// Conns L1, L2, L3 are literal addresses of one server each, with
	// options of their own; P is the name's pool.
	n := startNginx(t, ngxConf{Workers: 1, QServer: first,
		Extra:           map[string]string{"name": "cap.qrpc.test:" + port, "dns": dns.Addr},
		InitWorkerByLua: `        assert(require("resty.ffi.qrpc").configure{ max_connections = 4 })`,
		Server: loc("/c", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local which = ngx.var.arg_c
                local conn, err
                if which == "P" then
                    conn, err = qrpc.connect(qt.name, qt.opts({ resolve = 200, resolver = qt.dns, timeout = 3000 }))
                else
                    conn, err = qrpc.connect(qt.addr, qt.opts({ timeout = 3000 + tonumber(which:sub(2)) }))
                end
                if not conn then
                    return ngx.say("connect: ", err)
                end
                local _, cerr = conn:unary("echo", "x")
                ngx.say(cerr or "ok", " ", #conn:peers(), " ", qrpc.stats().connections)`) +
			loc("/pools", `
                ngx.say(require("resty.ffi.qrpc").stats().pools)`)})
	// connect returns "<call> <servers of the pool> <QUIC connections>"
	connect := func(c string) (servers, conns string) {
		t.Helper()
		code, body := n.get("/c?c=" + c)
		f := strings.Fields(body)
		if code != 200 || len(f) != 3 || f[0] != "ok" {
			t.Fatalf("connect %s: HTTP %d %q", c, code, body)
		}
		return f[1], f[2]
	}
	if servers, _ := connect("P"); servers != "3" {
		t.Fatalf("the name's pool has %s servers, want 3", servers)
	}
	testwait.Until(t, "the name's three connections up", 10*time.Second, func() bool {
		_, conns := connect("P")
		return conns == "3"
	})
	if _, conns := connect("L1"); conns != "4" {
		t.Fatalf("%s QUIC connections with P and L1, want 4", conns)
	}
	// L2 needs one more: P, the least recently used idle pool, goes.
	if _, conns := connect("L2"); conns != "2" {
		t.Fatalf("%s QUIC connections after L2 (cap 4), want 2: P (3 servers) closed", conns)
	}
	// P again: up with 3 servers it is over the cap; L1 (idle, least
	// recently used) makes room.
	connect("P")
	testwait.Until(t, "the cap kept with P back", 10*time.Second, func() bool {
		_, conns := connect("L2")
		return conns == "4"
	})
	// The name goes down to one address: P counts 1, and L3 fits
	// beside P and L2 without closing anyone.
	dns.Set("127.0.0.1")
	testwait.Until(t, "P follows DNS to one server", 15*time.Second, func() bool {
		servers, conns := connect("P")
		return servers == "1" && conns == "2"
	})
	if _, conns := connect("L3"); conns != "3" {
		t.Fatalf("%s QUIC connections after L3, want 3 (P 1, L2, L3)", conns)
	}
	if _, body := n.get("/pools"); strings.TrimSpace(body) != "3" {
		t.Fatalf("%s pools cached, want 3 (P, L2, L3)", strings.TrimSpace(body))
	}
}

// TestMaxConnectionsCapAfterReresolution: a pool whose name gains servers
// on re-resolution dials them in Go, with no connect of a new pool to
// keep max_connections: the next connect (here one that finds its pool
// cached) recounts and closes idle pools until the cap holds again.
func TestMaxConnectionsCapAfterReresolution(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	first := ownServer(t)
	_, port, _ := net.SplitHostPort(first.addr)
	for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		s, err := newTestServer(ip+":"+port, nil)
		if err != nil {
			t.Skipf("no server on %s:%s (loopback aliases?): %v", ip, port, err)
		}
		t.Cleanup(func() { _ = s.close() })
	}
	const name = "grow.qrpc.test."
	dns := dnstest.Start(t, name)
	dns.Set("127.0.0.1")
	n := startNginx(t, ngxConf{Workers: 1, QServer: first,
		Extra:           map[string]string{"name": "grow.qrpc.test:" + port, "dns": dns.Addr},
		InitWorkerByLua: `        assert(require("resty.ffi.qrpc").configure{ max_connections = 4 })`,
		Server: loc("/c", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local which = ngx.var.arg_c
                local conn, err
                if which == "P" then
                    conn, err = qrpc.connect(qt.name, qt.opts({ resolve = 200, resolver = qt.dns, timeout = 3000 }))
                else
                    conn, err = qrpc.connect(qt.addr, qt.opts({ timeout = 3000 + tonumber(which:sub(2)) }))
                end
                if not conn then
                    return ngx.say("connect: ", err)
                end
                local _, cerr = conn:unary("echo", "x")
                ngx.say(cerr or "ok", " ", qrpc.stats().connections)`) +
			loc("/held", `
                ngx.say(require("resty.ffi.qrpc").stats().connections)`)})
	connect := func(c string) int {
		t.Helper()
		code, body := n.get("/c?c=" + c)
		f := strings.Fields(body)
		if code != 200 || len(f) != 2 || f[0] != "ok" {
			t.Fatalf("connect %s: HTTP %d %q", c, code, body)
		}
		k, _ := strconv.Atoi(f[1])
		return k
	}
	held := func() int {
		_, body := n.get("/held")
		k, _ := strconv.Atoi(strings.TrimSpace(body))
		return k
	}
	connect("P")
	connect("L1")
	if k := connect("L2"); k != 3 {
		t.Fatalf("%d QUIC connections with P (1 server), L1, L2, want 3", k)
	}
	// The name grows to three servers: Go dials them, past the cap.
	dns.Set("127.0.0.1", "127.0.0.2", "127.0.0.3")
	testwait.Until(t, "P to dial the name's new servers", 15*time.Second, func() bool { return held() == 5 })
	// A connect that finds L2 cached brings the count back under the cap.
	var last int
	if !testwait.For(10*time.Second, func() bool {
		last = connect("L2")
		return last <= 4
	}) {
		t.Fatalf("%d QUIC connections after the name grew, cap 4", last)
	}
}

// TestClosedConnectionsAreCollected: a connection object that is closed
// and dropped is garbage. Its view (keyed weakly by the object) holds the
// cache entry; LuaJIT's weak tables are not ephemerons, so an entry that
// still held its objects would keep them and itself for the worker's life
// (about 1.6 KB a connect, in a worker that connects and closes).
func TestClosedConnectionsAreCollected(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	srv := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, QServer: srv, Server: loc("/t", `
                local qt = require "qtest"
                local seen = setmetatable({}, { __mode = "k" })
                local made = 0
                local function round(extra)
                    for _ = 1, 50 do
                        local conn = assert(qt.connect(extra and extra()))
                        assert(conn:unary("greet", "x"))
                        seen[conn] = true
                        made = made + 1
                        assert(conn:close())
                    end
                end
                round()
                -- bound to a methods table: an object of its own per table
                round(function() return { methods = { greet = {} } } end)
                collectgarbage()
                collectgarbage()
                local kept = 0
                for _ in pairs(seen) do
                    kept = kept + 1
                end
                ngx.say(made, " made, ", kept, " kept")`)})
	code, body := n.get("/t")
	var made, kept int
	if _, err := fmt.Sscanf(body, "%d made, %d kept", &made, &kept); code != 200 || err != nil || made != 100 {
		t.Fatalf("HTTP %d: %q", code, body)
	}
	// The last object of a round may still sit in a stack slot.
	if kept > 2 {
		t.Fatalf("%d of %d closed and dropped connection objects are not collected", kept, made)
	}
}

// TestMaxConnectionsPoolOverCap: a connect whose pool alone needs more
// QUIC connections than max_connections is refused with what it needs,
// and closes no idle pool on its way (it closed every idle pool, then
// said that every pool was busy).
func TestMaxConnectionsPoolOverCap(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1,
		Extra:           map[string]string{"p2": closedUDPPort(t), "p3": closedUDPPort(t)},
		InitWorkerByLua: `        assert(require("resty.ffi.qrpc").configure{ max_connections = 2 })`,
		Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local one = assert(qt.connect())
                assert(one:unary("echo", "x"))
                local pool, err = qrpc.connect({ qt.addr, "127.0.0.1:" .. qt.p2, "127.0.0.1:" .. qt.p3 },
                                               qt.opts({ balance = "round_robin" }))
                ngx.say(tostring(pool), " | ", err)
                local _, cerr = one:unary("echo", "x")
                ngx.say("the idle pool: ", cerr or "ok")`)})
	_, body := n.get("/t")
	want := "nil | qrpc: too many connections (2); this connect needs 3 (its servers × conns): raise qrpc.configure{ max_connections = n }\n" +
		"the idle pool: ok\n"
	if body != want {
		t.Errorf("got:\n%s\nwant:\n%s", body, want)
	}
}

// TestMaxConnectionsNamePoolOverCap: a pool of a name that comes up with
// more servers than the cap alone (counted as one at connect) closes no
// idle pool: that would not bring it under the cap (it closed them all).
func TestMaxConnectionsNamePoolOverCap(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	first, port, dns := threeServersByName(t, "rvcap.qrpc.test.")
	n := startNginx(t, ngxConf{Workers: 1, QServer: first,
		Extra:           map[string]string{"name": "rvcap.qrpc.test:" + port, "dns": dns.Addr},
		InitWorkerByLua: `        assert(require("resty.ffi.qrpc").configure{ max_connections = 2 })`,
		Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local one = assert(qt.connect())
                assert(one:unary("echo", "x"))
                local p, err = qrpc.connect(qt.name, qt.opts({ resolve = 200, resolver = qt.dns, timeout = 3000 }))
                ngx.say("P: ", p and #p:peers() or err)
                local _, cerr = one:unary("echo", "x")
                ngx.say("the idle pool: ", cerr or "ok")`)})
	_, body := n.get("/t")
	if body != "P: 3\nthe idle pool: ok\n" {
		t.Errorf("a name's pool over the cap alone:\n%s\nwant P: 3 and the idle pool ok", body)
	}
}

// TestMaxConnectionsBusyPlusNeed: a connect that fits the cap alone but
// not beside the busy pools, even with every idle pool closed, is refused
// and closes none (it closed them, then said every pool was busy).
func TestMaxConnectionsBusyPlusNeed(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1,
		InitWorkerByLua: `        assert(require("resty.ffi.qrpc").configure{ max_connections = 3 })`,
		Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local busy = assert(qt.connect({ streams = 2 }))
                local idle = assert(qt.connect({ streams = 3 }))
                assert(busy:unary("echo", "x"))
                assert(idle:unary("echo", "x"))
                local th = ngx.thread.spawn(function() return busy:unary("slow", "500") end)
                qt.wait(10, function() return busy:stats().inflight == 1 end)
                local p, err = qt.connect({ conns = 3 })
                ngx.say("conns=3: ", tostring(p), " | ", err)
                local _, cerr = idle:unary("echo", "x")
                ngx.say("the idle pool: ", cerr or "ok")
                ngx.thread.wait(th)`)})
	_, body := n.get("/t")
	want := "conns=3: nil | qrpc: too many connections (3); every pool has calls in flight or was just handed out by connect: " +
		"raise qrpc.configure{ max_connections = n } or connect to fewer distinct servers/options\nthe idle pool: ok\n"
	if body != want {
		t.Errorf("got:\n%s\nwant:\n%s", body, want)
	}
}

// threeServersByName starts servers on 127.0.0.1, .2 and .3 at one port
// (skipping without the loopback aliases) and a DNS server answering name
// with the three: the first server, the port, the DNS server.
func threeServersByName(t *testing.T, name string) (*testServer, string, *dnstest.Server) {
	t.Helper()
	first := ownServer(t)
	_, port, _ := net.SplitHostPort(first.addr)
	for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		s, err := newTestServer(ip+":"+port, nil)
		if err != nil {
			t.Skipf("no server on %s:%s (loopback aliases?): %v", ip, port, err)
		}
		t.Cleanup(func() { _ = s.close() })
	}
	dns := dnstest.Start(t, name)
	dns.Set("127.0.0.1", "127.0.0.2", "127.0.0.3")
	return first, port, dns
}
