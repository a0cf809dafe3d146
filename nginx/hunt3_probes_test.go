package nginx

// Probes of pools and metrics from outside (hunt-3) that pass: what was
// tried and held.

import (
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestHuntOptionProbe: connect and calls with odd pool options; prints
// what each returns (a probe, not an assertion yet).
func TestHuntOptionProbe(t *testing.T) {
	requireNginx(t)
	_, extra := startDemos(t, 2)
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra, HTTP: "    lua_shared_dict qrpc_pools 1m;\n    lua_shared_dict notpools 12k;\n",
		AllowErrors: []string{`.`}, Server: loc("/probe", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local cases = {
                    { "shared nodict", { shared = "nosuch" } },
                    { "shared num", { shared = 5 } },
                    { "shared true", { shared = true } },
                    { "shared tbl nodict", { shared = { dict = "nosuch", name = "x" } } },
                    { "shared tbl noname", { shared = { dict = "qrpc_pools" } } },
                    { "shared tbl emptyname", { shared = { dict = "qrpc_pools", name = "" } } },
                    { "shared tbl colon", { shared = { dict = "qrpc_pools", name = "a:b" } } },
                    { "shared tbl longname", { shared = { dict = "qrpc_pools", name = string.rep("n", 5000) } } },
                    { "shared tbl numname", { shared = { dict = "qrpc_pools", name = 7 } } },
                    { "shared extra key", { shared = { dict = "qrpc_pools", name = "a", x = 1 } } },
                    { "throttle k frac", { throttle = { k = 1.5 } } },
                    { "throttle k 0", { throttle = { k = 0 } } },
                    { "throttle codes 0", { throttle = { k = 2, codes = { 0 } } } },
                    { "throttle codes big", { throttle = { k = 2, codes = { 4294967296 } } } },
                    { "throttle codes 17", { throttle = { k = 2, codes = { 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17 } } } },
                    { "throttle codes map", { throttle = { k = 2, codes = { a = 1 } } } },
                    { "throttle str", { throttle = "on" } },
                    { "throttle true", { throttle = true } },
                    { "throttle empty", { throttle = {} } },
                    { "check nomethod", { check = { interval = 100 } } },
                    { "check str", { check = "health" } },
                    { "check interval 0", { check = { method = "ping", interval = 0 } } },
                    { "check timeout 0", { check = { method = "ping", timeout = 0 } } },
                    { "check timeout>interval", { check = { method = "ping", interval = 100, timeout = 5000 } } },
                    { "check empty method", { check = { method = "" } } },
                    { "resolve -1", { resolve = -1 } },
                    { "resolve 1", { resolve = 1 } },
                    { "resolve str", { resolve = "30s" } },
                    { "resolver bad", { resolver = "nohostport" } },
                    { "resolver port0", { resolver = "127.0.0.1:0" } },
                    { "resolver name", { resolver = "localhost:53" } },
                    { "resolver empty", { resolver = "" } },
                    { "balance empty", { balance = "" } },
                    { "retries 17", { retries = 17 } },
                    { "retries 1.5", { retries = 1.5 } },
                    { "try_timeout nan", { try_timeout = 0/0 } },
                    { "hedge delay p50", { hedge = { delay = "p50" } } },
                    { "hedge delay 0", { hedge = { delay = 0 } } },
                    { "hedge true", { hedge = true } },
                    { "hedge false", { hedge = false } },
                    { "budget ratio -0", { budget = { ratio = -0.0 } } },
                    { "budget min 1e6", { budget = { min_per_s = 1e6 } } },
                    { "health eject 0", { health = { eject = 0 } } },
                    { "health eject huge", { health = { eject = 1e12 } } },
                    { "health on empty", { health = { on = {} } } },
                    { "health failures 0", { health = { failures = 0 } } },
                    { "health stall inf", { health = { stall = math.huge } } },
                    { "methods num", { methods = { greet = 5 } } },
                    { "methods try", { methods = { greet = { try_timeout = -1 } } } },
                    { "methods hedge bad", { methods = { greet = { hedge = { max = 9 } } } } },
                    { "methods retries", { methods = { greet = { retries = 2 } } } },
                    { "conns 0", { conns = 0 } },
                    { "conns 1000", { conns = 1000 } },
                }
                for _, c in ipairs(cases) do
                    local ok, conn, err = pcall(qrpc.connect, { qt.s1, qt.s2 }, qt.opts(c[2]))
                    local line = c[1] .. ": "
                    if not ok then
                        line = line .. "THROW " .. tostring(conn)
                    elseif conn == nil and err == nil then
                        line = line .. "NIL NIL"
                    elseif conn then
                        local ok2, res, e2 = pcall(conn.unary, conn, "greet", "x")
                        line = line .. "conn; unary: " .. (ok2 and (res and ("ok " .. res.code) or ("nil, " .. tostring(e2))) or ("THROW " .. tostring(res)))
                    else
                        line = line .. "nil, " .. tostring(err)
                    end
                    ngx.say(line)
                end`)})
	st, body := n.get("/probe")
	t.Logf("%d\n%s", st, body)
}

// TestHuntMetricsRetriesMatchCalls: three server processes behind a pool
// with try_timeout and retries, two workers summing into metrics_dict;
// one server SIGSTOPped then continued, another killed -9 and restarted,
// under load. The scrape must count what the callers saw: every attempt
// once in qrpc_client_calls_total, every retry once in
// qrpc_client_retries_total.
func TestHuntMetricsRetriesMatchCalls(t *testing.T) {
	m, tally := huntRun(t, `timeout = 1000, try_timeout = 100, retries = 1,
                        health = { failures = 3, eject = 1000 },`)
	calls := metricSum(m, "qrpc_client_calls_total", `method="slow"`)
	retries := metricSum(m, "qrpc_client_retries_total")
	budget := metricSum(m, "qrpc_client_retry_budget_exhausted_total")
	if int(calls) != tally.attempts {
		t.Errorf("qrpc_client_calls_total{method=\"slow\"} sums to %v; the callers saw %d attempts", calls, tally.attempts)
	}
	if int(retries) != tally.retried {
		t.Errorf("qrpc_client_retries_total sums to %v; the callers saw %d retries", retries, tally.retried)
	}
	if int(budget) < tally.budget {
		t.Errorf("qrpc_client_retry_budget_exhausted_total %v < %d calls with info.budget", budget, tally.budget)
	}
	if v := metricSum(m, "qrpc_client_inflight"); v != 0 {
		t.Errorf("qrpc_client_inflight sums to %v with no call in flight", v)
	}
}

// TestHuntMetricsHedges: the same scenario with hedged copies and no
// retries: every copy sent is one qrpc_client_retries_total{reason="hedge"}.
func TestHuntMetricsHedges(t *testing.T) {
	m, tally := huntRun(t, `timeout = 1000, hedge = { delay = 20 }, budget = { ratio = 0.5 },
                        health = { failures = 3, eject = 1000 },`)
	hedges := metricSum(m, "qrpc_client_retries_total", `reason="hedge"`)
	retries := metricSum(m, "qrpc_client_retries_total")
	calls := metricSum(m, "qrpc_client_calls_total", `method="slow"`)
	if int(hedges) != tally.retried || retries != hedges {
		t.Errorf("qrpc_client_retries_total: %v hedge, %v in all; the callers saw %d copies", hedges, retries, tally.retried)
	}
	if int(calls) > tally.attempts {
		t.Errorf("qrpc_client_calls_total{method=\"slow\"} sums to %v; more than the %d attempts the callers saw", calls, tally.attempts)
	}
	if v := metricSum(m, "qrpc_client_inflight"); v != 0 {
		t.Errorf("qrpc_client_inflight sums to %v with no call in flight", v)
	}
}

// huntRun: three server processes behind a pool with opts, two workers
// summing into metrics_dict; one server SIGSTOPped then continued,
// another killed -9 and restarted, under load (16 clients, "slow" 3 ms).
// It returns the scrape after two flushes and what the callers saw.
func huntRun(t *testing.T, opts string) (map[string]float64, *callTally) {
	requireNginx(t)
	srvs, extra := startDemos(t, 3)
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect({ qt.s1, qt.s2, qt.s3 }, qt.opts({
                        ` + opts + `
                    }))
                end
`
	n := startNginx(t, ngxConf{Workers: 2, Extra: extra,
		HTTP:            "    lua_shared_dict qrpc_metrics 4m;\n",
		InitWorkerByLua: `assert(require("resty.ffi.qrpc").configure{ metrics_dict = "qrpc_metrics" })`,
		Server:          loc("/hcall", pl+callAttemptsLua) + metricsScrapeLoc,
		AllowErrors:     []string{`qrpc: `}})
	tally := &callTally{errs: map[string]int{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get(n.url("/hcall?m=slow&b=3&n=4"))
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				tally.add(string(b))
			}
		}()
	}
	time.Sleep(time.Second)
	_ = srvs[1].cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(1500 * time.Millisecond)
	_ = srvs[1].cmd.Process.Signal(syscall.SIGCONT)
	time.Sleep(time.Second)
	srvs[2].kill()
	time.Sleep(time.Second)
	srvs[2].start()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	time.Sleep(2500 * time.Millisecond) // two flushes
	m, text := scrape(t, n)
	calls := metricSum(m, "qrpc_client_calls_total", `method="slow"`)
	retries := metricSum(m, "qrpc_client_retries_total")
	budget := metricSum(m, "qrpc_client_retry_budget_exhausted_total")
	hist := metricSum(m, "qrpc_client_call_duration_seconds_count", `method="slow"`)
	t.Logf("client: %d calls, %d attempts, %d retries, %d budget; errors %v", tally.calls, tally.attempts, tally.retried, tally.budget, tally.errs)
	t.Logf("metrics: calls_total %v, histogram count %v, retries_total %v, budget %v", calls, hist, retries, budget)
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "qrpc_client_calls_total") && !strings.HasSuffix(l, " 0") ||
			strings.HasPrefix(l, "qrpc_client_retr") || strings.HasPrefix(l, "qrpc_client_ejections") ||
			strings.HasPrefix(l, "qrpc_client_inflight") || strings.HasPrefix(l, "qrpc_client_connections") {
			t.Log(l)
		}
	}
	return m, tally
}

// TestHuntThrottleCounted: calls answered with an overload code through
// a throttling pool, in two workers: the refusals the callers saw are
// qrpc_client_throttled_total, and qrpc_client_calls_total counts only
// what was sent.
func TestHuntThrottleCounted(t *testing.T) {
	requireNginx(t)
	_, extra := startDemos(t, 2)
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect({ qt.s1, qt.s2 }, qt.opts({
                        timeout = 1000, throttle = { k = 2, codes = { 8 } },
                    }))
                end
`
	n := startNginx(t, ngxConf{Workers: 2, Extra: extra,
		HTTP:            "    lua_shared_dict qrpc_metrics 4m;\n",
		InitWorkerByLua: `assert(require("resty.ffi.qrpc").configure{ metrics_dict = "qrpc_metrics" })`,
		Server:          loc("/hcall", pl+callAttemptsLua) + metricsScrapeLoc,
		AllowErrors:     []string{`qrpc: `}})
	tally := &callTally{errs: map[string]int{}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 100 {
		resp, err := client.Get(n.url("/hcall?m=fail&b=8&n=5"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tally.add(string(b))
	}
	time.Sleep(2500 * time.Millisecond)
	m, text := scrape(t, n)
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "qrpc_client_calls_total") && !strings.HasSuffix(l, " 0") || strings.HasPrefix(l, "qrpc_client_throttled") {
			t.Log(l)
		}
	}
	throttled := tally.errs["unavailable: throttled"]
	t.Logf("client: %d calls; errors %v; %d attempts", tally.calls, tally.errs, tally.attempts)
	got := metricSum(m, "qrpc_client_throttled_total")
	if int(got) != throttled {
		t.Errorf("qrpc_client_throttled_total %v; the callers saw %d refusals", got, throttled)
	}
	sent := metricSum(m, "qrpc_client_calls_total", `method="fail"`)
	if int(sent) != tally.calls-throttled {
		t.Errorf("qrpc_client_calls_total{method=\"fail\"} %v; want the %d calls not throttled", sent, tally.calls-throttled)
	}
}

// TestHuntConnectionsGauge: qrpc_client_connections counts one per
// server of a connection whatever its conns, and a pool closed by the
// connection cap leaves it.
func TestHuntConnectionsGauge(t *testing.T) {
	requireNginx(t)
	_, extra := startDemos(t, 3)
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra, Server: metricsScrapeLoc + loc("/p1", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                qrpc.configure{ max_connections = 8 }
                local conn, err = qrpc.connect({ qt.s1, qt.s2 }, qt.opts({ conns = 4, timeout = 1000 }))
                if not conn then ngx.say("connect: ", err) return end
                local res, e = conn:unary("greet", "x")
                ngx.say(res and "ok" or e)`) + loc("/p2", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qrpc.connect({ qt.s3 }, qt.opts({ timeout = 1000 }))
                if not conn then ngx.say("connect: ", err) return end
                local res, e = conn:unary("greet", "x")
                ngx.say(res and "ok" or e)`),
		AllowErrors: []string{`qrpc: `}})
	show := func(what string) map[string]float64 {
		m, text := scrape(t, n)
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "qrpc_client_connections") && !strings.HasSuffix(l, " 0") {
				t.Logf("%s: %s", what, l)
			}
		}
		return m
	}
	if st, body := n.get("/p1"); strings.TrimSpace(body) != "ok" {
		t.Fatalf("/p1: %d %s", st, body)
	}
	m := show("after p1")
	for _, s := range []string{extra["s1"], extra["s2"]} {
		if v := metricSum(m, "qrpc_client_connections", `server="`+s+`"`); v != 1 {
			t.Errorf("conns = 4: qrpc_client_connections{server=%q} sums to %v, want 1", s, v)
		}
	}
	if st, body := n.get("/p2"); strings.TrimSpace(body) != "ok" {
		t.Fatalf("/p2: %d %s", st, body)
	}
	time.Sleep(500 * time.Millisecond)
	m = show("after p2")
	for _, s := range []string{extra["s1"], extra["s2"]} {
		if v := metricSum(m, "qrpc_client_connections", `server="`+s+`"`); v != 0 {
			t.Errorf("the pool closed by the cap: qrpc_client_connections{server=%q} sums to %v, want 0", s, v)
		}
	}
	if v := metricSum(m, "qrpc_client_connections", `server="`+extra["s3"]+`"`, `state="up"`); v != 1 {
		t.Errorf("qrpc_client_connections{server=%q,state=\"up\"} %v, want 1", extra["s3"], v)
	}
}

// TestHuntSRVTiers: an SRV name with two priorities, real server
// processes: calls go to the first tier; kill -9 of it moves them to the
// second; restarted, the first takes them back.
func TestHuntSRVTiers(t *testing.T) {
	requireNginx(t)
	srvs, _ := startDemos(t, 2)
	port := func(addr string) uint16 {
		_, p, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(p)
		return uint16(n)
	}
	const name = "_qrpc._udp.tiers.qrpc.test."
	dns := dnstest.Start(t, name)
	dns.SetA("a.qrpc.test.", "127.0.0.1")
	dns.SetA("b.qrpc.test.", "127.0.0.1")
	dns.SetSRV(name,
		dnstest.SRV{Priority: 0, Weight: 1, Port: port(srvs[0].addr), Target: "a.qrpc.test."},
		dnstest.SRV{Priority: 1, Weight: 1, Port: port(srvs[1].addr), Target: "b.qrpc.test."})
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect(qt.srv, qt.opts({ resolver = qt.dns, resolve = 500, timeout = 1000,
                        health = { failures = 3, eject = 1000 } }))
                end
`
	n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"dns": dns.Addr, "srv": strings.TrimSuffix(name, ".")},
		Server: callsLoc("/hcall", pl) + loc("/peers", pl+`
                local conn = pool()
                for _, p in ipairs(conn and conn:peers() or {}) do
                    ngx.say(p.addr, " ", p.state, " calls=", p.calls)
                end`), AllowErrors: []string{`qrpc: `}})
	calls := func() (a, b int) { return srvs[0].calls(t), srvs[1].calls(t) }
	batch := func(what string) (fails int) {
		_, body := n.get("/hcall?n=50")
		fails = countPrefixed(body, "err ")
		if fails > 0 {
			t.Logf("%s: %d failed: %s", what, fails, body)
		}
		return fails
	}
	batch("tier 0 up")
	a, b := calls()
	t.Logf("both up: a=%d b=%d", a, b)
	if b != 0 {
		t.Errorf("the second tier took %d calls with the first up", b)
	}
	srvs[0].kill()
	time.Sleep(100 * time.Millisecond)
	f := batch("tier 0 killed")
	_, body := n.get("/peers")
	t.Logf("peers after the kill: %s", body)
	if f > 1 {
		t.Errorf("%d of 50 calls failed with the first tier killed and the second up", f)
	}
	srvs[0].start()
	restarted := time.Now()
	ok := false
	for time.Since(restarted) < 20*time.Second {
		a0, _ := srvs[0].calls(t), 0
		batch("tier 0 restarted")
		if srvs[0].calls(t) > a0+1 {
			ok = true
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, body = n.get("/peers")
	t.Logf("first tier back after %v: %v; peers %s", time.Since(restarted).Round(time.Millisecond), ok, body)
	if !ok {
		t.Error("the restarted first tier took no calls within 20 s")
	}
}

// TestHuntCheckEjectsAndBrings: with check and no traffic, a SIGSTOPped
// server is ejected by its failed checks, and the first check it answers
// after SIGCONT brings it back (pools.md: "a failure counts as a passive
// failure, any answer brings an ejected server back at once").
func TestHuntCheckEjectsAndBrings(t *testing.T) {
	requireNginx(t)
	srvs, extra := startDemos(t, 2)
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect({ qt.s1, qt.s2 }, qt.opts({ timeout = 1000,
                        check = { method = "greet", interval = 200, timeout = 100 },
                        health = { failures = 3, eject = 10000 } }))
                end
`
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra,
		Server: callsLoc("/hcall", pl) + loc("/peers", pl+`
                local conn, err = pool()
                if not conn then ngx.say("connect: ", err) return end
                for _, p in ipairs(conn:peers()) do
                    ngx.say(p.addr, " ", p.state, " failures=", p.failures, " stalled=", tostring(p.stalled))
                end`), AllowErrors: []string{`qrpc: `}})
	if _, body := n.get("/hcall?n=4"); countPrefixed(body, "ok 0") != 4 {
		t.Fatalf("/hcall: %s", body)
	}
	state := func() string {
		_, body := n.get("/peers")
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, srvs[1].addr+" ") {
				return strings.TrimPrefix(l, srvs[1].addr+" ")
			}
		}
		return "? " + body
	}
	_ = srvs[1].cmd.Process.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	var st string
	for time.Since(stopped) < 10*time.Second {
		if st = state(); strings.HasPrefix(st, "ejected") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after SIGSTOP: %s after %v", st, time.Since(stopped).Round(time.Millisecond))
	if !strings.HasPrefix(st, "ejected") {
		_ = srvs[1].cmd.Process.Signal(syscall.SIGCONT)
		t.Fatalf("frozen server not ejected by its checks within 10 s: %s", st)
	}
	_ = srvs[1].cmd.Process.Signal(syscall.SIGCONT)
	cont := time.Now()
	for time.Since(cont) < 8*time.Second {
		if st = state(); strings.HasPrefix(st, "up") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after SIGCONT: %s after %v", st, time.Since(cont).Round(time.Millisecond))
	if !strings.HasPrefix(st, "up") {
		t.Errorf("the server answers again but is not back within 8 s (checks every 200 ms, ejection 10 s): %s", st)
	}
}

// TestHuntBudgetNone: budget = { ratio = 0, min_per_s = 0 } allows no
// retry and no copy: each call that wanted one fails (or is answered)
// with info.budget / no copy, and each refusal is one
// qrpc_client_retry_budget_exhausted_total.
func TestHuntBudgetNone(t *testing.T) {
	requireNginx(t)
	_, extra := startDemos(t, 2)
	mk := func(opts string) string {
		return `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect({ qt.s1, qt.s2 }, qt.opts({ timeout = 1000,
                        budget = { ratio = 0, min_per_s = 0 }, ` + opts + ` }))
                end
`
	}
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra,
		Server: callsLoc("/retry", mk(`retries = 1, try_timeout = 50, health = { on = { "connect", "reset" } }`)) +
			loc("/hedge", mk(`hedge = { delay = 20 }`)+callAttemptsLua) + metricsScrapeLoc,
		AllowErrors: []string{`qrpc: `}})
	_, body := n.get("/retry?m=slow&b=150&n=10")
	t.Logf("/retry:\n%s", body)
	m, _ := scrape(t, n)
	b1 := metricSum(m, "qrpc_client_retry_budget_exhausted_total")
	if want := countPrefixed(body, "err timeout | attempts=1 budget=true"); int(b1) != want || want != 10 {
		t.Errorf("retries: %d calls said budget=true (want 10), qrpc_client_retry_budget_exhausted_total %v", want, b1)
	}
	_, body = n.get("/hedge?m=slow&b=60&n=10")
	t.Logf("/hedge:\n%s", body)
	m, _ = scrape(t, n)
	b2 := metricSum(m, "qrpc_client_retry_budget_exhausted_total") - b1
	if ok := countPrefixed(body, "ok 0 1"); ok != 10 || b2 != 10 {
		t.Errorf("hedges: %d calls answered with 1 attempt (want 10), qrpc_client_retry_budget_exhausted_total grew by %v (want 10)", ok, b2)
	}
	if h := metricSum(m, "qrpc_client_retries_total"); h != 0 {
		t.Errorf("qrpc_client_retries_total %v with no retry or copy sent", h)
	}
}

// TestHuntPerCallOff: per call, retries = 0 and hedge = false turn off
// the connection's retries and hedging (pools.md's own example passes
// retries = 0).
func TestHuntPerCallOff(t *testing.T) {
	requireNginx(t)
	_, extra := startDemos(t, 2)
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local r = assert(qrpc.connect({ qt.s1, qt.s2 }, qt.opts({ timeout = 1000, retries = 1, try_timeout = 50,
                    health = { failures = 1000, stall = 0 } })))
                local h = assert(qrpc.connect({ qt.s1, qt.s2 }, qt.opts({ timeout = 1000, hedge = { delay = 10 },
                    budget = { ratio = 1, min_per_s = 1000 }, health = { failures = 1000, stall = 0 } })))
                local res, err, info = r:unary("slow", "120", { retries = 0 })
                ngx.say("retries=0: ", tostring(res and res.attempts), " ", tostring(err), " ", tostring(info and info.attempts))
                res, err, info = h:unary("slow", "60", { hedge = false })
                ngx.say("hedge=false: ", tostring(res and res.attempts), " ", tostring(err), " ", tostring(info and info.attempts))`)})
	_, body := n.get("/t")
	t.Logf("%s", body)
	if !strings.Contains(body, "retries=0: nil timeout nil") {
		t.Errorf("retries = 0 per call still retried: %s", body)
	}
	if !strings.Contains(body, "hedge=false: 1 nil") {
		t.Errorf("hedge = false per call still sent a copy: %s", body)
	}
}

// TestHuntDNSGauges: qrpc_client_connections follows DNS: a server DNS
// drops leaves the gauge, and one that comes back counts once.
func TestHuntDNSGauges(t *testing.T) {
	requireNginx(t)
	first := ownServer(t)
	_, port, _ := net.SplitHostPort(first.addr)
	second, err := newTestServer("127.0.0.2:"+port, nil)
	if err != nil {
		t.Skipf("no server on 127.0.0.2:%s: %v", port, err)
	}
	t.Cleanup(func() { _ = second.close() })
	dns := dnstest.Start(t, "g.qrpc.test.")
	dns.Set("127.0.0.1", "127.0.0.2")
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect(qt.name, qt.opts({ resolve = 100, resolver = qt.dns, timeout = 1000 }))
                end
`
	n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"name": "g.qrpc.test:" + port, "dns": dns.Addr},
		Server: callsLoc("/hcall", pl) + metricsScrapeLoc, AllowErrors: []string{`qrpc: `}})
	call := func() {
		if _, body := n.get("/hcall?m=who&n=6"); countPrefixed(body, "ok 0") != 6 {
			t.Fatalf("/hcall: %s", body)
		}
	}
	gauge := func(srv string) (float64, string) {
		m, text := scrape(t, n)
		var ls []string
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "qrpc_client_connections{server=\""+srv) && !strings.HasSuffix(l, " 0") {
				ls = append(ls, l)
			}
		}
		return metricSum(m, "qrpc_client_connections", `server="`+srv+`"`), strings.Join(ls, "; ")
	}
	s2 := "127.0.0.2:" + port
	call()
	if v, ls := gauge(s2); v != 1 {
		t.Fatalf("both named: %v (%s)", v, ls)
	}
	dns.Set("127.0.0.1")
	time.Sleep(800 * time.Millisecond)
	call()
	if v, ls := gauge(s2); v != 0 {
		t.Errorf("DNS dropped %s: its gauge sums to %v (%s), want 0", s2, v, ls)
	}
	dns.Set("127.0.0.1", "127.0.0.2")
	time.Sleep(800 * time.Millisecond)
	call()
	if v, ls := gauge(s2); v != 1 {
		t.Errorf("DNS named %s again: its gauge sums to %v (%s), want 1", s2, v, ls)
	}
}

// TestHuntCallOptionProbe: per-call options at their edges, on a hash
// pool and a round-robin one: nil, err or an answer, never a throw.
func TestHuntCallOptionProbe(t *testing.T) {
	requireNginx(t)
	_, extra := startDemos(t, 2)
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local h = assert(qrpc.connect({ qt.s1, qt.s2 }, qt.opts({ balance = "hash", timeout = 1000 })))
                local r = assert(qrpc.connect({ qt.s1, qt.s2 }, qt.opts({ timeout = 1000 })))
                local cases = {
                    { "hash no key", h, "unary", nil },
                    { "hash key num", h, "unary", { hash_key = 123 } },
                    { "hash key empty", h, "unary", { hash_key = "" } },
                    { "hash key long", h, "unary", { hash_key = string.rep("k", 100000) } },
                    { "hash key table", h, "unary", { hash_key = {} } },
                    { "hash event no key", h, "event", nil },
                    { "hash event key", h, "event", { hash_key = "a" } },
                    { "rr event key", r, "event", { hash_key = "a" } },
                    { "rr unary key", r, "unary", { hash_key = "a" } },
                    { "retries -1", r, "unary", { retries = -1 } },
                    { "retries 16", r, "unary", { retries = 16 } },
                    { "retries 1e300", r, "unary", { retries = 1e300 } },
                    { "try 1e10", r, "unary", { try_timeout = 1e10 } },
                    { "try 0.5", r, "unary", { try_timeout = 0.5 } },
                    { "hedge delay -1", r, "unary", { hedge = { delay = -1 } } },
                    { "hedge max 0", r, "unary", { hedge = { delay = 5, max = 0 } } },
                    { "hedge p95", r, "unary", { hedge = { delay = "p95" } } },
                    { "event retries", r, "event", { retries = 1 } },
                    { "event hedge false", r, "event", { hedge = false } },
                    { "deadline nan", r, "unary", { deadline = 0/0 } },
                    { "deadline inf", r, "unary", { deadline = math.huge } },
                    { "deadline -inf", r, "unary", { deadline = -math.huge } },
                    { "timeout nan", r, "unary", { timeout = 0/0 } },
                }
                for _, c in ipairs(cases) do
                    local conn = c[2]
                    local ok, a, e, info = pcall(conn[c[3]], conn, "greet", "x", c[4])
                    local line = c[1] .. ": "
                    if not ok then
                        line = line .. "THROW " .. tostring(a)
                    elseif a == nil and e == nil then
                        line = line .. "NIL NIL"
                    elseif a then
                        line = line .. "ok"
                    else
                        line = line .. "nil, " .. tostring(e) .. " info=" .. type(info)
                    end
                    ngx.say(line)
                end`), AllowErrors: []string{`qrpc: `}})
	_, body := n.get("/t")
	t.Logf("\n%s", body)
	if strings.Contains(body, "THROW") || strings.Contains(body, "NIL NIL") || strings.Contains(body, "info=nil") {
		t.Errorf("a throw, nil, nil or no info table:\n%s", body)
	}
}

// TestHuntKilledWorkerGauges: metrics.md: gauges "leave the sum when the
// worker exits (or 5 s after it died without exiting)". A worker killed
// -9 with calls in flight: its inflight and connections leave the sum.
func TestHuntKilledWorkerGauges(t *testing.T) {
	requireNginx(t)
	_, extra := startDemos(t, 1)
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect(qt.s1, qt.opts({ timeout = 20000 }))
                end
`
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra,
		HTTP:            "    lua_shared_dict qrpc_metrics 4m;\n",
		InitWorkerByLua: `assert(require("resty.ffi.qrpc").configure{ metrics_dict = "qrpc_metrics" })`,
		Server:          callsLoc("/hcall", pl) + metricsScrapeLoc,
		AllowErrors:     []string{`qrpc: `}, AllowAlerts: []string{`worker process \d+ exited on signal 9`}})
	for range 3 {
		go func() {
			client := &http.Client{Timeout: 30 * time.Second}
			if resp, err := client.Get(n.url("/hcall?m=slow&b=15000")); err == nil {
				resp.Body.Close()
			}
		}()
	}
	time.Sleep(2500 * time.Millisecond)
	m, _ := scrape(t, n)
	t.Logf("before the kill: inflight %v, connections %v", metricSum(m, "qrpc_client_inflight"), metricSum(m, "qrpc_client_connections"))
	pids := n.workerPIDs()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	killed := time.Now()
	time.Sleep(7 * time.Second)
	m, _ = scrape(t, n)
	inflight, conns := metricSum(m, "qrpc_client_inflight"), metricSum(m, "qrpc_client_connections")
	t.Logf("%v after the kill: inflight %v, connections %v", time.Since(killed).Round(time.Millisecond), inflight, conns)
	if inflight != 0 || conns > 1 {
		t.Errorf("the killed worker's gauges still count: inflight %v, connections %v", inflight, conns)
	}
}

// TestHuntMetricsHedgeAndRetry: hedging, try timeouts and retries
// together, under the huntRun scenario: every copy and retry sent is one
// qrpc_client_retries_total, and qrpc_client_calls_total counts no more
// attempts than were sent.
func TestHuntMetricsHedgeAndRetry(t *testing.T) {
	m, tally := huntRun(t, `timeout = 1000, try_timeout = 100, retries = 1, hedge = { delay = 30 },
                        budget = { ratio = 0.5 }, health = { failures = 3, eject = 1000 },`)
	retries := metricSum(m, "qrpc_client_retries_total")
	calls := metricSum(m, "qrpc_client_calls_total", `method="slow"`)
	if int(retries) != tally.retried {
		t.Errorf("qrpc_client_retries_total %v; the callers saw %d retries and copies", retries, tally.retried)
	}
	if int(calls) > tally.attempts {
		t.Errorf("qrpc_client_calls_total{method=\"slow\"} %v; more than the %d attempts the callers saw", calls, tally.attempts)
	}
	if v := metricSum(m, "qrpc_client_inflight"); v != 0 {
		t.Errorf("qrpc_client_inflight sums to %v with no call in flight", v)
	}
}
