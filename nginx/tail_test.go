package nginx

import (
	"fmt"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
)

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// metricSum adds the series of a metric whose labels contain every
// fragment given.
func metricSum(m map[string]float64, name string, frags ...string) float64 {
	sum := 0.0
	for k, v := range m {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, f := range frags {
			ok = ok && strings.Contains(k, f)
		}
		if ok {
			sum += v
		}
	}
	return sum
}

const tailMetricsLoc = `
                local text, err = require("resty.ffi.qrpc").metrics()
                if not text then
                    ngx.status = 500
                    ngx.say("metrics: ", err)
                    return
                end
                ngx.print(text)`

// TestPoolTryTimeoutLua: three server processes, one SIGSTOPped for 3 s
// under 50 concurrent calls with timeout = 1000, try_timeout = 150,
// retries = 1. No call fails; no call takes longer than the try timeout
// and a healthy answer (plus the machine's pauses); the frozen server is
// stalled or ejected within 250 ms; the metrics count one retry for each
// attempt that timed out, and every call's attempts.
func TestPoolTryTimeoutLua(t *testing.T) {
	t.Parallel()
	requireNginx(t)
	srvs, extra := startDemos(t, 3)
	const pool = `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect({ qt.s1, qt.s2, qt.s3 }, qt.opts({
                        timeout = 1000, try_timeout = 150, retries = 1,
                        health = { failures = 3, eject = 1000 },
                    }))
                end
`
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra,
		Server: loc("/call", pool+poolCallLua(`"greet", "pool"`)) + loc("/metrics", tailMetricsLoc) +
			loc("/peers", pool+`
                local conn = assert(pool())
                for _, p in ipairs(conn:peers()) do
                    ngx.say(p.addr, " ", p.state, " ", p.stalled)
                end`),
		AllowErrors: []string{`qrpc: (re-dial failed|connection lost)`}})

	load := startLoad(t, n, "/call", 50)
	load.past(t, time.Now(), 5, 30*time.Second, "5 healthy calls by every client")
	healthy, errs := load.take()
	if len(errs) > 0 {
		t.Fatalf("healthy: %d calls failed, first %s", len(errs), errs[0])
	}
	unit := pct(healthy, 0.99)

	victim := srvs[1]
	pz := testsrv.ProbePauses()
	stopped := time.Now()
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.cmd.Process.Signal(syscall.SIGCONT) })
	// Within 250 ms (plus the machine's pauses) new calls go elsewhere.
	var skippedAfter time.Duration
	for time.Since(stopped) < 3*time.Second {
		_, body := n.get("/peers")
		for _, l := range strings.Split(body, "\n") {
			f := strings.Fields(l)
			if len(f) == 3 && f[0] == victim.addr && (f[1] == "ejected" || f[2] == "true") {
				skippedAfter = time.Since(stopped)
			}
		}
		if skippedAfter > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond) // the scenario's sampling period (5 ms) of /peers: the test measures when the frozen server is skipped
	}
	time.Sleep(time.Until(stopped.Add(3 * time.Second))) // the scenario: the server stays frozen for 3 s
	_ = victim.cmd.Process.Signal(syscall.SIGCONT)
	load.past(t, time.Now(), 1, 30*time.Second, "a call by every client after the thaw")
	load.stop()
	pause := pz.End()
	lat, errs := load.take()
	t.Logf("healthy p99 %v, longest pause %v; frozen for 3 s: %d calls, p50 %v p99 %v max %v; skipped after %v",
		unit, pause, len(lat), pct(lat, 0.5), pct(lat, 0.99), pct(lat, 1), skippedAfter)
	if len(errs) > 0 {
		// A call has a second for a try timeout and a healthy answer: only
		// a machine that stood still for a good part of it explains a miss.
		if pause < 400*time.Millisecond {
			t.Fatalf("%d of %d calls failed with a server frozen (longest pause %v), first: %s", len(errs), len(lat), pause, errs[0])
		}
		t.Logf("%d of %d calls failed; the machine stood still for %v", len(errs), len(lat), pause)
	}
	if skippedAfter == 0 || skippedAfter > 250*time.Millisecond+2*pause {
		t.Errorf("the frozen server was skipped after %v, want within 250 ms (+ pauses %v)", skippedAfter, pause)
	}
	if worst, bound := pct(lat, 1), 150*time.Millisecond+3*unit+2*pause+20*time.Millisecond; worst > bound {
		t.Errorf("slowest call %v, want <= try timeout + a healthy answer + pauses (%v)", worst, bound)
	}

	m, _ := scrapeAny(t, n)
	v := `server="` + victim.addr + `"`
	timedOut := metricSum(m, "qrpc_client_calls_total", v, `result="timeout"`)
	retried := metricSum(m, "qrpc_client_retries_total", v)
	if timedOut == 0 || retried != timedOut {
		t.Errorf("frozen server: %v attempts timed out, %v retries counted", timedOut, retried)
	}
	attempts := metricSum(m, "qrpc_client_calls_total")
	allRetries := metricSum(m, "qrpc_client_retries_total")
	calls := float64(len(healthy) + len(lat))
	// A call still in flight when the load stopped is counted by its
	// client but may not have ended: allow the clients' count of them.
	if attempts-allRetries < calls-50 || attempts-allRetries > calls {
		t.Errorf("%v attempts - %v retries, want the %v calls made", attempts, allRetries, calls)
	}
	t.Logf("metrics: %v attempts, %v retries (%v after timeouts on the frozen server)", attempts, allRetries, retried)
}

// scrapeAny fetches /metrics (this worker's, no dict) into series -> value.
func scrapeAny(t *testing.T, n *nginxProc) (map[string]float64, string) {
	t.Helper()
	return scrape(t, n)
}

// TestPoolHedgeLua: one server answers "who" after 200 ms, two at once.
// With hedge = { delay = 20 }, the p99 stays near the delay, copies go
// only for the slow server's calls, and the metrics count them. With
// every server slow, the budget bounds the copies and counts what it
// refused.
func TestPoolHedgeLua(t *testing.T) {
	t.Parallel()
	requireNginx(t)
	srvs := []*testServer{ownServer(t), ownServer(t), ownServer(t)}
	extra := map[string]string{}
	for i, s := range srvs {
		extra[fmt.Sprintf("s%d", i+1)] = s.addr
	}
	hedged := func(opts string) string {
		return `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect({ qt.s1, qt.s2, qt.s3 }, qt.opts({` + opts + `}))
                end` + whoLua
	}
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra,
		// Round-robin sends a third of the calls to the slow server: the
		// budget must allow a copy for each (the default allows a fifth).
		Server: loc("/who", hedged(`hedge = { delay = 20 }, budget = { ratio = 0.5 }, health = { stall = 0 }`)) +
			loc("/budget", hedged(`hedge = { delay = 5, max = 2 }, budget = { ratio = 0.1, min_per_s = 0 }, health = { stall = 0 }`)) +
			loc("/metrics", tailMetricsLoc)})

	const delay = 20 * time.Millisecond
	healthy := timedGets(t, n, "/who", 600, 20)
	unit := pct(healthy, 0.99)
	over := 0
	for _, d := range healthy {
		if d > delay {
			over++
		}
	}
	before, _ := scrape(t, n)
	srvs[0].whoDelay.Store(200)
	pz := testsrv.ProbePauses()
	const calls = 2000
	lat := timedGets(t, n, "/who", calls, 20)
	pause := pz.End()
	after, _ := scrape(t, n)
	copies := metricSum(after, "qrpc_client_retries_total", `reason="hedge"`) -
		metricSum(before, "qrpc_client_retries_total", `reason="hedge"`)
	p99 := pct(lat, 0.99)
	t.Logf("healthy p99 %v, longest pause %v; one server 200 ms, hedge after %v: p50 %v p99 %v; %v copies for %d calls",
		unit, pause, delay, pct(lat, 0.5), p99, copies, calls)
	if bound := max(50*time.Millisecond, delay+3*unit+2*pause+20*time.Millisecond); p99 > bound {
		t.Errorf("p99 %v, want <= %v", p99, bound)
	}
	if allowed := float64(calls*4/10 + calls*over/len(healthy)); copies > allowed || copies == 0 {
		t.Errorf("%v copies for %d calls, want 1..%v (40 %% + the %d of %d healthy calls over the delay)",
			copies, calls, allowed, over, len(healthy))
	}

	// Every server slow: copies stay within 10 % of the calls.
	for _, s := range srvs {
		s.whoDelay.Store(60)
	}
	before, _ = scrape(t, n)
	const slowCalls = 300
	timedGets(t, n, "/budget", slowCalls, 20)
	after, _ = scrape(t, n)
	copies = metricSum(after, "qrpc_client_retries_total", `reason="hedge"`) -
		metricSum(before, "qrpc_client_retries_total", `reason="hedge"`)
	refused := metricSum(after, "qrpc_client_retry_budget_exhausted_total") -
		metricSum(before, "qrpc_client_retry_budget_exhausted_total")
	t.Logf("every server slow: %v copies for %d calls, %v refused by the budget", copies, slowCalls, refused)
	if copies > slowCalls/10+1 || refused == 0 {
		t.Errorf("every server slow: %v copies for %d calls (budget 10 %%), %v refused", copies, slowCalls, refused)
	}
}

// timedGets makes calls GETs of path, conc at a time; every one must
// answer 200. It returns their latencies.
func timedGets(t *testing.T, n *nginxProc, path string, calls, conc int) []time.Duration {
	t.Helper()
	var mu sync.Mutex
	var lat []time.Duration
	var errs []string
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls / conc {
				b := time.Now()
				st, body := n.get(path)
				d := time.Since(b)
				mu.Lock()
				lat = append(lat, d)
				if st != 200 {
					errs = append(errs, fmt.Sprintf("%d %s", st, strings.TrimSpace(body)))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d calls to %s failed, first: %s", len(errs), calls, path, errs[0])
	}
	return lat
}

// TestNoFalseStalls: three healthy servers, 50 concurrent calls for 30 s
// beside a CPU hog: no server is ever found stalled. (With a flat 25 ms
// limit and no check that other servers answer, the same run logs a stall
// for every server, as often as the log allows.)
func TestNoFalseStalls(t *testing.T) {
	requireNginx(t)
	ngxtest.Long(t, "30 s beside a busy loop per CPU")
	_, extra := startDemos(t, 3)
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra, Server: loc("/call", poolLua+poolCallLua(`"greet", "pool"`))})
	// A busy loop per CPU: every process, nginx and the servers
	// included, waits its turn.
	for range runtime.NumCPU() {
		hog := exec.Command("sh", "-c", "while :; do :; done")
		if err := hog.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hog.Process.Kill(); _ = hog.Wait() })
	}
	load := startLoad(t, n, "/call", 50)
	time.Sleep(30 * time.Second) // the scenario: 30 s of calls beside the hog
	load.stop()
	lat, errs := load.take()
	stalls := n.logCount(`qrpc: server stalled`)
	first := ""
	if len(errs) > 0 {
		first = " (first: " + errs[0] + ")"
	}
	t.Logf("30 s beside a CPU hog: %d calls, p50 %v p99 %v max %v; %d failed%s; %d stall notices",
		len(lat), pct(lat, 0.5), pct(lat, 0.99), pct(lat, 1), len(errs), first, stalls)
	if stalls != 0 {
		for _, l := range strings.Split(n.errorLog(), "\n") {
			if strings.Contains(l, "qrpc: server stalled") {
				t.Log(l)
			}
		}
		t.Errorf("%d stall notices for healthy servers", stalls)
	}
	// Failures are not the point here: a machine that stands still for
	// seconds (the whole test suite runs beside this one) times calls
	// out, and that is right.
}

// TestPoolCallOptionsLua: try_timeout and hedge given per call, or per
// method in connect's methods, reach Go and take effect: with both servers
// holding "who" for 300 ms, a per-call try timeout of 50 ms and one retry
// fail after two attempts long before the call's timeout; with one server
// slow, a per-call hedge answers from the other.
func TestPoolCallOptionsLua(t *testing.T) {
	t.Parallel()
	requireNginx(t)
	s1, s2 := ownServer(t), ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"s1": s1.addr, "s2": s2.addr}, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect({ qt.s1, qt.s2 }, qt.opts({
                    timeout = 3000, health = { stall = 0, failures = 1000 },
                    methods = { who = { try_timeout = 50 } } })))
                local plain = assert(qrpc.connect({ qt.s1, qt.s2 }, qt.opts({
                    timeout = 3000, health = { stall = 0, failures = 1000 } })))
                local mode = ngx.var.arg_mode
                local t0 = ngx.now()
                local res, err, info
                if mode == "call" then
                    res, err, info = plain:unary("who", "", { try_timeout = 50, retries = 1 })
                elseif mode == "method" then
                    res, err, info = conn:unary("who", "", { retries = 1 })
                elseif mode == "off" then
                    res, err = conn:unary("who", "", { try_timeout = 0 })
                else
                    res, err = plain:unary("who", "", { hedge = { delay = 10 } })
                end
                ngx.update_time()
                if info and info.attempts then err = err .. " attempts=" .. info.attempts end
                -- ngx.now() counts whole ms, but the difference of two
                -- such doubles near 1.7e9 is off by an ulp: 300 ms came
                -- out as 299.99999 (floor: 299); rounded, it is exact.
                ngx.say(res and res.body or err, " ", math.floor((ngx.now() - t0) * 1000 + 0.5))`)})
	s1.whoDelay.Store(300)
	s2.whoDelay.Store(300)
	for _, mode := range []string{"call", "method"} {
		_, body := n.get("/t?mode=" + mode)
		f := strings.Fields(body)
		if len(f) < 2 || !strings.HasPrefix(body, "timeout attempts=2 ") || atoi(f[len(f)-1]) >= 300 {
			t.Errorf("%s: %q, want timeout after 2 attempts in under 300 ms", mode, body)
		}
	}
	_, body := n.get("/t?mode=off")
	if f := strings.Fields(body); len(f) != 2 || (f[0] != s1.addr && f[0] != s2.addr) || atoi(f[1]) < 300 {
		t.Errorf("try_timeout = 0 per call: %q, want a server's answer after the 300 ms", body)
	}
	s1.whoDelay.Store(300)
	s2.whoDelay.Store(0)
	for range 4 {
		_, body := n.get("/t?mode=hedge")
		if f := strings.Fields(body); len(f) != 2 || f[0] != s2.addr || atoi(f[1]) >= 300 {
			t.Errorf("hedge per call: %q, want %s in under 300 ms", body, s2.addr)
		}
	}
}

// TestUnaryAttemptsLua: res.attempts counts a call's attempts, on the
// flavour's host. s1 holds "who" until the attempt is given up, so a call
// whose first attempt went there is answered by s2 on its retry: 2
// attempts, as many such calls as "who" attempts at s1 in the metrics.
// A call that s2 answered first, and a plain call, made 1.
func TestUnaryAttemptsLua(t *testing.T) {
	t.Parallel()
	requireNginx(t)
	s1, s2 := ownServer(t), ownServer(t)
	s1.whoDelay.Store(int64(time.Hour / time.Millisecond))
	const calls = 4
	n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"s1": s1.addr, "s2": s2.addr}, Server: loc("/t", fmt.Sprintf(`
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect({ qt.s1, qt.s2 }, qt.opts({
                    timeout = 10000, health = { stall = 0, failures = 1000 } })))
                for _ = 1, %d do
                    local res, err = conn:unary("who", "", { try_timeout = 1000, retries = 1 })
                    ngx.say(res and res.body .. " " .. tostring(res.attempts) or err)
                end
                local res, err = conn:unary("echo", "plain")
                ngx.say(res and res.body .. " " .. tostring(res.attempts) or err)`, calls)) +
		loc("/metrics", tailMetricsLoc)})
	st, body := n.get("/t")
	got := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if st != 200 || len(got) != calls+1 {
		t.Fatalf("%d %q", st, body)
	}
	retried := 0
	for _, l := range got[:calls] {
		switch l {
		case s2.addr + " 2":
			retried++
		case s2.addr + " 1":
		default:
			t.Errorf("who: %q, want %s and 1 or 2 attempts", l, s2.addr)
		}
	}
	if got[calls] != "plain 1" {
		t.Errorf("plain call: %q, want \"plain 1\"", got[calls])
	}
	m, _ := scrapeAny(t, n)
	if atS1 := metricSum(m, "qrpc_client_calls_total", `method="who"`, `server="`+s1.addr+`"`); retried == 0 || float64(retried) != atS1 {
		t.Errorf("%d calls made 2 attempts, %v attempts went to %s: want as many, and some", retried, atS1, s1.addr)
	}
}
