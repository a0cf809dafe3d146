package nginx

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// identityLua: pool A ejects one of two servers (two calls time out,
// health.failures = 1; the last server up stays); pool B, on the same
// servers through the same dict, then calls and reports how many servers
// it has ejected. ?same=name gives both pools that shared name.
var identityLua = loc("/identity", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local name = ngx.var.arg_same
                local shared = name and { dict = "qpools", name = name } or "qpools"
                local health = { failures = 1, on = { "timeout" }, eject = 60000 }
                local a = assert(qrpc.connect({ qt.a, qt.b }, qt.opts({
                    shared = shared, timeout = 150 + tonumber(ngx.var.arg_n), health = health })))
                local b = assert(qrpc.connect({ qt.a, qt.b }, qt.opts({
                    shared = shared, timeout = 5000 + tonumber(ngx.var.arg_n), health = health })))
                for _ = 1, 2 do
                    a:unary("slow", "1000")
                end
                local function ejected(c)
                    local n = 0
                    for _, p in ipairs(c:peers()) do
                        if p.state == "ejected" then n = n + 1 end
                    end
                    return n
                end
                -- B steps before each call (the dict's version moved) and at
                -- least every 100 ms while it calls
                for _ = 1, 5 do
                    b:unary("echo", "x")
                    ngx.sleep(0.12)
                end
                ngx.say(ejected(a), " ", ejected(b))`)

// TestPoolSharedIdentity: two pools that differ only in their timeout
// are two pools: an ejection in one does not reach the other through the
// dict; two pools given the same name (shared = { dict, name }) share,
// whatever their options.
func TestPoolSharedIdentity(t *testing.T) {
	a, b := ownServer(t), ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP,
		Extra:  map[string]string{"a": a.addr, "b": b.addr},
		Server: identityLua})
	if code, body := n.get("/identity?n=1"); code != 200 || body != "1 0\n" {
		t.Errorf("pools of different timeouts: HTTP %d, ejected in A and B: %q, want \"1 0\"", code, body)
	}
	if code, body := n.get("/identity?n=2&same=orders"); code != 200 || body != "1 1\n" {
		t.Errorf("pools named alike: HTTP %d, ejected in A and B: %q, want \"1 1\"", code, body)
	}
}

// runLoc reads and writes the test's dict qrun: /run?k=key (&v=value).
var runLoc = loc("/run", `
                local run = ngx.shared.qrun
                if ngx.var.arg_v then
                    run:set(ngx.var.arg_k, ngx.var.arg_v)
                end
                ngx.say(run:get(ngx.var.arg_k) or "")`)

func runGet(n *nginxProc, k string) string {
	_, body := n.get("/run?k=" + k)
	return strings.TrimSpace(body)
}

// TestPoolSharedChurn: a pool of two servers and a name whose 40
// addresses change at every re-resolution (6,000 addresses in all, on a
// port where nothing listens); an ejection one worker makes then still
// reaches every other worker. A worker keeps no state per address it
// ever saw: what it shares is rebuilt from its pool's servers.
func TestPoolSharedChurn(t *testing.T) {
	a, b := ownServer(t), ownServer(t)
	dead := closedUDPPort(t)
	dns := dnstest.Start(t, "churn.qrpc.test.")
	list := func(round int) []string {
		out := make([]string, 40)
		for i := range out {
			k := round*40 + i
			out[i] = fmt.Sprintf("127.%d.%d.%d", 1+k/65536, (k/256)%256, k%256)
		}
		return out
	}
	dns.Set(list(0)...)
	const workers = 4
	n := startNginx(t, ngxConf{Workers: workers, HTTP: sharedPoolsHTTP + "lua_shared_dict qrun 1m;\n",
		Extra:  map[string]string{"a": a.addr, "b": b.addr, "name": "churn.qrpc.test:" + dead, "dns": dns.Addr},
		Server: runLoc,
		InitWorkerByLua: `
        ngx.timer.at(0, function()
            local qt = require "qtest"
            local run = ngx.shared.qrun
            -- timeout = 300 bounds the connect too: on a loaded machine
            -- a first try may time out, as a user's would, and is retried
            local conn, err
            for _ = 1, 50 do
                conn, err = require("resty.ffi.qrpc").connect({ qt.a, qt.b, qt.name }, qt.opts({
                    shared = "qpools", resolve = 50, resolver = qt.dns, timeout = 300,
                    balance = "hash",
                    health = { failures = 1, on = { "timeout" }, eject = 60000 } }))
                if conn or err ~= "connect: timeout" then break end
                ngx.sleep(0.1)
            end
            if not conn then ngx.log(ngx.ERR, "connect: ", err) return end
            local me = ngx.worker.id()
            run:incr("ready", 1, 0)
            -- every worker calls (and so steps) until told to stop, and
            -- says which servers it has ejected once the victim is named
            for _ = 1, 200000 do
                if run:get("stop") or ngx.worker.exiting() then break end
                conn:unary("echo", "x", { hash_key = "k" })
                if run:get("victim") then
                    if me == 0 and not run:get("failed") then
                        -- times out on the server the key maps to, which
                        -- ejects it (the other one is up)
                        run:set("failed", true)
                        conn:unary("slow", "1000", { hash_key = "k" })
                    end
                    for _, p in ipairs(conn:peers()) do
                        if p.state == "ejected" then
                            run:set("saw:" .. me, p.addr)
                        end
                    end
                end
                local n = 0
                for _, p in ipairs(conn:peers()) do
                    if p.addr:find("^127%.1") then n = n + 1 end
                end
                run:set("churn:" .. me, n)
                ngx.sleep(0.01)
            end
        end)`})
	testwait.Until(t, "the workers calling", 30*time.Second, func() bool {
		return runGet(n, "ready") == strconv.Itoa(workers)
	})
	// 150 rounds of 40 new addresses, each left until it was resolved
	for round := 1; round <= 150; round++ {
		dns.Set(list(round)...)
		q0 := dns.Queries()
		testwait.Until(t, "a re-resolution", 10*time.Second, func() bool { return dns.Queries() >= q0+2 })
	}
	dns.Set("127.250.0.1")
	testwait.Until(t, "every worker off the churned addresses", 30*time.Second, func() bool {
		for w := range workers {
			if runGet(n, "churn:"+strconv.Itoa(w)) != "0" {
				return false
			}
		}
		return true
	})
	runGet(n, "victim&v=1")
	testwait.Until(t, "every worker sees the ejection", 30*time.Second, func() bool {
		for w := range workers {
			if runGet(n, "saw:"+strconv.Itoa(w)) == "" {
				return false
			}
		}
		return true
	})
	runGet(n, "stop&v=1")
}

// closedUDPPort is a loopback UDP port where nothing listens.
func closedUDPPort(t *testing.T) string {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(c.LocalAddr().String())
	c.Close()
	return port
}

// probesIn counts the probes s received in (from, to].
func probesIn(s *testServer, from, to time.Time) int {
	n := 0
	for _, p := range s.probeTimes() {
		if p.After(from) && !p.After(to) {
			n++
		}
	}
	return n
}

// TestPoolSharedTimersExhausted: with every running timer of each worker
// taken (lua_max_running_timers 32, 40 timers that sleep), a shared
// pool still probes from one worker: its leases ride on Go's timer, not
// on Lua's. The same pool unshared, side by side, probes from all four.
func TestPoolSharedTimersExhausted(t *testing.T) {
	if ng.Host() != "builtin" {
		// The lua-resty-ffi host takes no step requests: its lease steps
		// ride on ngx.timer.every, which this test starves (docs/pools.md).
		t.Skip("leases on Go's timer need the built-in host")
	}
	a, c := ownServer(t), ownServer(t)
	const interval = 100 // ms
	n := startNginx(t, ngxConf{Workers: 4, HTTP: sharedPoolsHTTP + "lua_shared_dict qrun 1m;\nlua_max_running_timers 32;\n",
		Extra:  map[string]string{"a": a.addr, "c": c.addr},
		Server: runLoc,
		InitWorkerByLua: `
        ngx.timer.at(0, function()
            local qrpc = require "resty.ffi.qrpc"
            local qt = require "qtest"
            local check = { method = "probe", interval = ` + strconv.Itoa(interval) + ` }
            assert(qrpc.connect(qt.a, qt.opts({ check = check, shared = "qpools" })))
            assert(qrpc.connect(qt.c, qt.opts({ check = check })))
            -- then every running timer of the worker is taken, until /run
            -- sets "free"
            for _ = 1, 40 do
                ngx.timer.at(0, function()
                    ngx.shared.qrun:incr("sleepers", 1, 0)
                    for _ = 1, 300 do
                        if ngx.worker.exiting() or ngx.shared.qrun:get("free") then break end
                        ngx.sleep(0.1)
                    end
                    ngx.shared.qrun:incr("sleepers", -1, 0)
                end)
            end
        end)`,
		AllowAlerts: []string{`lua_max_running_timers are not enough`},
	})
	testwait.For(30*time.Second, func() bool { return strings.Contains(n.errorLog(), "lua_max_running_timers are not enough") })
	// the leases settle, then a window of 40 of the unshared pool's probes
	start := time.Now()
	testwait.For(30*time.Second, func() bool { return probesIn(c, start, time.Now()) >= 20 })
	from := time.Now()
	testwait.For(30*time.Second, func() bool { return probesIn(c, from, time.Now()) >= 40 })
	to := time.Now()
	shared, local := probesIn(a, from, to), probesIn(c, from, to)
	t.Logf("timers exhausted: shared pool %d probes, unshared %d", shared, local)
	if shared == 0 || 2*shared > local {
		t.Errorf("shared pool: %d probes where the unshared one sent %d: want about a quarter (one prober)", shared, local)
	}
	// The sleepers end before nginx stops: at exit, nginx runs the
	// dispatcher's exit watch only with a running timer free (with none,
	// the worker's exit waits for the dispatcher's idle wait).
	runGet(n, "free&v=1")
	testwait.For(10*time.Second, func() bool { return runGet(n, "sleepers") == "0" })
}

// TestPoolSharedReloadReleases: on reload, the old worker gives up its
// leases as it starts shutting down, while a request keeps it alive: the
// new worker probes, the old one no longer does (one prober, not two).
func TestPoolSharedReloadReleases(t *testing.T) {
	a := ownServer(t)
	const interval = 100 // ms
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP + "lua_shared_dict qrun 1m;\n",
		Extra: map[string]string{"a": a.addr},
		InitWorkerByLua: `
        ngx.timer.at(0, function()
            local qt = require "qtest"
            assert(require("resty.ffi.qrpc").connect(qt.a, qt.opts({
                check = { method = "probe", interval = ` + strconv.Itoa(interval) + ` }, shared = "qpools" })))
        end)`,
		Server: leaseLoc + runLoc + loc("/hold", `
                ngx.shared.qrun:set("holding", ngx.worker.pid())
                ngx.sleep(tonumber(ngx.var.arg_s)) -- the scenario: a long request
                ngx.say("held")`),
	})
	old := n.workerPIDs()
	testwait.For(30*time.Second, func() bool { return len(a.probeTimes()) >= 5 })
	held := make(chan string, 1)
	go func() {
		_, body := n.get("/hold?s=6")
		held <- body
	}()
	testwait.Until(t, "the request held by the old worker", 10*time.Second, func() bool {
		return runGet(n, "holding") == strconv.Itoa(old[0])
	})
	n.signal("reload")
	var fresh []int
	testwait.For(30*time.Second, func() bool {
		fresh = nil
		for _, p := range n.workerPIDs() {
			if !slices.Contains(old, p) {
				fresh = append(fresh, p)
			}
		}
		return len(fresh) == 1
	})
	if len(fresh) != 1 {
		t.Fatalf("no new worker after the reload: %v (was %v)", n.workerPIDs(), old)
	}
	// the new worker holds the probe lease
	testwait.For(10*time.Second, func() bool {
		_, body := n.get("/lease")
		return strings.Contains(body, fmt.Sprintf("probe %d\n", fresh[0]))
	})
	from := time.Now()
	testwait.For(10*time.Second, func() bool { return time.Since(from) >= 20*interval*time.Millisecond })
	to := time.Now()
	oldAlive := false
	for _, p := range n.workerPIDs() {
		oldAlive = oldAlive || slices.Contains(old, p)
	}
	got := probesIn(a, from, to)
	rounds := float64(to.Sub(from)) / float64(interval*time.Millisecond)
	t.Logf("after the reload: %d probes in %.1f rounds (old worker alive: %v)", got, rounds, oldAlive)
	if !oldAlive {
		t.Fatal("the old worker exited before the window: the request did not hold it")
	}
	// one prober sends at most one probe a round (a loaded machine sends
	// fewer, never more); two send two
	if float64(got) > 1.5*rounds+2 {
		t.Errorf("%d probes in %.1f rounds while the old worker shuts down: two probers", got, rounds)
	}
	if body := <-held; body != "held\n" {
		t.Errorf("the held request: %q", body)
	}
}

// TestPoolSharedCloseReleases: a shared pool that closes (conn:close(),
// or evicted from the connection cache to make room) gives up the leases
// it holds at once, instead of leaving them to lapse while no worker
// probes.
func TestPoolSharedCloseReleases(t *testing.T) {
	a := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP,
		Extra: map[string]string{"a": a.addr},
		Server: leaseLoc + loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local how = ngx.var.arg_how
                if how == "evict" then
                    assert(qrpc.configure{ max_connections = 1 })
                end
                local conn = assert(qrpc.connect(qt.a, qt.opts({ timeout = 3000 + #how,
                    check = { method = "probe", interval = 100 }, shared = "qpools" })))
                assert(conn:unary("echo", "x"))
                local function held()
                    for _, k in ipairs(ngx.shared.qpools:get_keys(0)) do
                        if k:match(":lp@%w+$") then return true end
                    end
                end
                for _ = 1, 100 do
                    if held() then break end
                    ngx.sleep(0.02)
                end
                if not held() then return ngx.say("no probe lease") end
                if how == "evict" then
                    -- the other server's pool takes the only room
                    local other = assert(qrpc.connect(qt.shared_addr, qt.opts({ timeout = 3002 })))
                    assert(other:unary("echo", "y"))
                else
                    conn:close()
                end
                ngx.say(held() and "lease kept" or "lease given up")`)})
	for _, how := range []string{"close", "evict"} {
		if code, body := n.get("/t?how=" + how); code != 200 || body != "lease given up\n" {
			t.Errorf("%s: HTTP %d: %q", how, code, body)
		}
	}
}
