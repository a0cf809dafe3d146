package nginx

// Metrics under failing servers, throttling, DNS changes and a killed
// worker: the sums agree with what the callers saw.

import (
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMetricsMatchCallersWithRetries: three server processes behind a pool
// with try_timeout and retries, two workers summing into metrics_dict;
// one server SIGSTOPped then continued, another killed -9 and restarted,
// under load. The scrape must count what the callers saw: every attempt
// sent at least once in qrpc_client_calls_total (which also counts the
// attempts a down server's connection refused at once, not in a call's
// attempts: metrics.md), every retry once in qrpc_client_retries_total.
func TestMetricsMatchCallersWithRetries(t *testing.T) {
	m, tally := runFailingServers(t, `timeout = 1000, try_timeout = 100, retries = 1,
                        health = { failures = 3, eject = 1000 },`)
	calls := metricSum(m, "qrpc_client_calls_total", `method="slow"`)
	retries := metricSum(m, "qrpc_client_retries_total")
	budget := metricSum(m, "qrpc_client_retry_budget_exhausted_total")
	if int(calls) < tally.attempts {
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

// TestMetricsMatchCallersWithHedges: the same scenario with hedged copies and no
// retries: every copy sent is one qrpc_client_retries_total{reason="hedge"}.
func TestMetricsMatchCallersWithHedges(t *testing.T) {
	m, tally := runFailingServers(t, `timeout = 1000, hedge = { delay = 20 }, budget = { ratio = 0.5 },
                        health = { failures = 3, eject = 1000 },`)
	hedges := metricSum(m, "qrpc_client_retries_total", `reason="hedge"`)
	retries := metricSum(m, "qrpc_client_retries_total")
	if int(hedges) != tally.retried || retries != hedges {
		t.Errorf("qrpc_client_retries_total: %v hedge, %v in all; the callers saw %d copies", hedges, retries, tally.retried)
	}
	// no bound on qrpc_client_calls_total here: a hedged copy cancelled
	// when the other answered has no outcome, and an attempt refused at
	// once is counted without being in the caller's attempts
	if v := metricSum(m, "qrpc_client_inflight"); v != 0 {
		t.Errorf("qrpc_client_inflight sums to %v with no call in flight", v)
	}
}

// runFailingServers: three server processes behind a pool with opts, two workers
// summing into metrics_dict; one server SIGSTOPped then continued,
// another killed -9 and restarted, under load (16 clients, "slow" 3 ms).
// It returns the scrape after two flushes and what the callers saw.
func runFailingServers(t *testing.T, opts string) (map[string]float64, *callTally) {
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

// TestMetricsMatchCallersWithHedgesAndRetries: hedging, try timeouts and retries
// together, under the runFailingServers scenario: every copy and retry sent is one
// qrpc_client_retries_total.
func TestMetricsMatchCallersWithHedgesAndRetries(t *testing.T) {
	m, tally := runFailingServers(t, `timeout = 1000, try_timeout = 100, retries = 1, hedge = { delay = 30 },
                        budget = { ratio = 0.5 }, health = { failures = 3, eject = 1000 },`)
	retries := metricSum(m, "qrpc_client_retries_total")
	if int(retries) != tally.retried {
		t.Errorf("qrpc_client_retries_total %v; the callers saw %d retries and copies", retries, tally.retried)
	}
	// qrpc_client_calls_total: no bound, as in TestMetricsMatchCallersWithHedges
	if v := metricSum(m, "qrpc_client_inflight"); v != 0 {
		t.Errorf("qrpc_client_inflight sums to %v with no call in flight", v)
	}
}

// TestMetricsThrottledNotInCalls: calls answered with an overload code through
// a throttling pool, in two workers: the refusals the callers saw are
// qrpc_client_throttled_total, and qrpc_client_calls_total counts only
// what was sent.
func TestMetricsThrottledNotInCalls(t *testing.T) {
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

// TestMetricsConnectionsPerServer: qrpc_client_connections counts one per
// server of a connection whatever its conns, and a pool closed by the
// connection cap leaves it.
func TestMetricsConnectionsPerServer(t *testing.T) {
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

// TestMetricsConnectionsFollowDNS: qrpc_client_connections follows DNS: a server DNS
// drops leaves the gauge, and one that comes back counts once.
func TestMetricsConnectionsFollowDNS(t *testing.T) {
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

// TestMetricsKilledWorkerGaugesLeave: metrics.md: gauges "leave the sum when the
// worker exits (or 5 s after it died without exiting)". A worker killed
// -9 with calls in flight: its inflight and connections leave the sum.
func TestMetricsKilledWorkerGaugesLeave(t *testing.T) {
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
