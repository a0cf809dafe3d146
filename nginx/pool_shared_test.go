package nginx

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// sharedPoolsHTTP declares the dict of the shared-pool tests.
const sharedPoolsHTTP = "lua_shared_dict qpools 1m;\n"

// leaseLoc answers the pid holding each lease of the dict qpools.
var leaseLoc = loc("/lease", `
                local d = ngx.shared.qpools
                for _, k in ipairs(d:get_keys(0)) do
                    -- the leases: lp (probe), ld (DNS), each followed by
                    -- @<its address list>; a lease names its holder's
                    -- view, "<pid>-<random>"
                    local what = ({ lp = "probe", ld = "dns" })[k:match(":(%a+)@%w+$")]
                    if what then
                        ngx.say(what, " ", d:get(k):match("^(%d+)-"))
                    end
                end`)

func (s *testServer) probeTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.probes...)
}

// TestPoolSharedOneProberOneResolver: with 4 workers, a shared pool sends
// its active checks from one worker and re-resolves from one, where the
// same pool unshared does both from every worker (side by side in the
// same nginx, so the machine's load weighs on both alike); when the
// worker holding the probe lease is killed, another takes over.
func TestPoolSharedOneProberOneResolver(t *testing.T) {
	a, b := ownServer(t), ownServer(t) // shared pool's
	c, d := ownServer(t), ownServer(t) // unshared pool's
	port := func(s *testServer) string { _, p, _ := net.SplitHostPort(s.addr); return p }
	dnsShared := dnstest.Start(t, "shared.qrpc.test.")
	dnsShared.Set("127.0.0.1")
	dnsLocal := dnstest.Start(t, "local.qrpc.test.")
	dnsLocal.Set("127.0.0.1")
	const interval = 100 // ms
	n := startNginx(t, ngxConf{Workers: 4, HTTP: sharedPoolsHTTP,
		Extra: map[string]string{"a": a.addr, "b": b.addr, "c": c.addr, "d": d.addr,
			"rs": "shared.qrpc.test:" + port(a), "rl": "local.qrpc.test:" + port(c),
			"dns_s": dnsShared.Addr, "dns_l": dnsLocal.Addr},
		InitWorkerByLua: `
        ngx.timer.at(0, function()
            local qrpc = require "resty.ffi.qrpc"
            local qt = require "qtest"
            local check = { method = "probe", interval = ` + strconv.Itoa(interval) + ` }
            local conns = {
                { { qt.a, qt.b }, { check = check, shared = "qpools" } },
                { { qt.c, qt.d }, { check = check } },
                { qt.rs, { resolve = ` + strconv.Itoa(interval) + `, resolver = qt.dns_s, shared = "qpools" } },
                { qt.rl, { resolve = ` + strconv.Itoa(interval) + `, resolver = qt.dns_l } },
            }
            for _, cn in ipairs(conns) do
                local conn, err = qrpc.connect(cn[1], qt.opts(cn[2]))
                if not conn then
                    ngx.log(ngx.ERR, "connect: ", err)
                end
            end
        end)`,
		Server:      leaseLoc,
		AllowAlerts: []string{`worker process \d+ exited on signal 9`},
	})

	// Every worker probes the unshared pool's servers; wait for 40 of its
	// rounds at c (10 rounds of 4 workers), then compare.
	testwait.For(30*time.Second, func() bool { return c.eventCount("probe") >= 40 })
	shared, local := a.eventCount("probe"), c.eventCount("probe")
	sq, lq := dnsShared.Queries(), dnsLocal.Queries()
	t.Logf("probes: shared pool %d (b %d), unshared %d (d %d); DNS queries: shared %d, unshared %d",
		shared, b.eventCount("probe"), local, d.eventCount("probe"), sq, lq)
	if local < 40 {
		t.Fatalf("the unshared pool sent %d probes to %s in 30 s", local, c.addr)
	}
	// 4 workers: the unshared pool probes 4 times as often; the shared one
	// once per interval (at most twice while a lease changes hands)
	if shared == 0 || 2*shared > local {
		t.Errorf("shared pool: %d probes where the unshared one sent %d: want about a quarter", shared, local)
	}
	// DNS: each worker resolves once at connect, then one worker per period
	// (a name asks A and AAAA: two queries a resolution)
	if sq == 0 || 2*sq > lq {
		t.Errorf("shared pool: %d DNS queries where the unshared one sent %d: want about a quarter", sq, lq)
	}

	// The worker holding the probe lease dies: another takes over.
	_, body := n.get("/lease")
	var leader int
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "probe" {
			leader, _ = strconv.Atoi(f[1])
		}
	}
	if leader == 0 {
		t.Fatalf("no probe lease in the dict: %q", body)
	}
	before := a.probeTimes()
	maxGap := time.Duration(0)
	for i := 1; i < len(before); i++ {
		maxGap = max(maxGap, before[i].Sub(before[i-1]))
	}
	killed := time.Now()
	if err := syscall.Kill(leader, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var after []time.Time
	testwait.For(30*time.Second, func() bool {
		after = nil
		for _, p := range a.probeTimes() {
			if p.After(killed) {
				after = append(after, p)
			}
		}
		return len(after) >= 5
	})
	if len(after) < 5 {
		t.Fatalf("after the probe lease holder (pid %d) was killed, %d probes in 30 s", leader, len(after))
	}
	gap := after[0].Sub(killed)
	t.Logf("probe lease holder killed: next probe %v later (largest gap before: %v)", gap, maxGap)
	// the lease lapses 2.5 periods after its last renewal (renewed every
	// period), a follower tries every period, then its prober's next
	// round: within 4.5 intervals, plus what the machine's pauses added
	// before the kill
	if limit := 9*interval*time.Millisecond/2 + maxGap; gap > limit {
		t.Errorf("probes resumed %v after the lease holder died: want within %v", gap, limit)
	}
	_, body = n.get("/lease")
	if strings.Contains(body, fmt.Sprintf("probe %d\n", leader)) {
		t.Errorf("the dead worker %d still holds the probe lease: %q", leader, body)
	}
}

// TestPoolSharedEjection: an ejection one worker makes holds in the
// others: 4 workers call a pool of two servers with a hash key that maps
// to b; one worker's call times out on b (health.failures = 1 ejects it);
// no call that any worker starts more than 100 ms after that goes to b.
// Without sharing, the other workers go on calling b.
func TestPoolSharedEjection(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shared", false: "local"}[shared], func(t *testing.T) {
			a, b := ownServer(t), ownServer(t)
			opt := ""
			if shared {
				opt = `shared = "qpools", `
			}
			n := startNginx(t, ngxConf{Workers: 4, HTTP: sharedPoolsHTTP + "lua_shared_dict qrun 1m;\n",
				Extra: map[string]string{"a": a.addr, "b": b.addr},
				InitWorkerByLua: `
        local function pool()
            local qrpc = require "resty.ffi.qrpc"
            local qt = require "qtest"
            return qrpc.connect({ qt.a, qt.b }, qt.opts({ ` + opt + `balance = "hash",
                health = { failures = 1, on = { "timeout" }, eject = 60000 } }))
        end
        -- each worker: calls with the key every 5 ms until told to stop,
        -- counting those that went to b after the ejection + 100 ms
        ngx.timer.at(0, function()
            local qt = require "qtest"
            local run = ngx.shared.qrun
            local conn, err = pool()
            if not conn then ngx.log(ngx.ERR, "connect: ", err) return end
            run:incr("ready", 1, 0)
            for _ = 1, 20000 do
                if run:get("stop") then break end
                local key = run:get("key")
                if key then
                    local started = ngx.now()
                    local res = conn:unary("who", "", { hash_key = key })
                    local t0 = run:get("t0")
                    if res and res.body == qt.b then
                        run:incr("b_calls", 1, 0)
                        if t0 and started > t0 + 0.1 then
                            run:incr("late", 1, 0)
                        end
                    end
                    if t0 and started > t0 + 0.1 then
                        run:incr("after", 1, 0)
                    end
                end
                ngx.sleep(0.005) -- the scenario: each worker calls every 5 ms
            end
        end)`,
				Server: loc("/key", `
                local qt = require "qtest"
                local conn = assert(require("resty.ffi.qrpc").connect({ qt.a, qt.b }, qt.opts({ `+opt+`balance = "hash",
                    health = { failures = 1, on = { "timeout" }, eject = 60000 } })))
                for i = 1, 1000 do
                    local res = conn:unary("who", "", { hash_key = "k" .. i })
                    if res and res.body == qt.b then
                        ngx.shared.qrun:set("key", "k" .. i)
                        ngx.say("k", i)
                        return
                    end
                end
                ngx.say("none")`) + loc("/eject", `
                local qt = require "qtest"
                local run = ngx.shared.qrun
                local conn = assert(require("resty.ffi.qrpc").connect({ qt.a, qt.b }, qt.opts({ `+opt+`balance = "hash",
                    health = { failures = 1, on = { "timeout" }, eject = 60000 } })))
                local _, err = conn:unary("slow", "2000", { hash_key = run:get("key"), timeout = 50 })
                run:set("t0", ngx.now())
                local peers = conn:peers()
                for _, p in ipairs(peers) do
                    if p.addr == qt.b then ngx.say(err, " ", p.state) end
                end`) + loc("/run", `
                local run = ngx.shared.qrun
                ngx.say(run:get("ready") or 0, " ", run:get("b_calls") or 0, " ", run:get("after") or 0, " ", run:get("late") or 0)`) + loc("/stop", `ngx.shared.qrun:set("stop", true)`),
			})
			defer n.get("/stop")
			run := func() (ready, bCalls, after, late int) {
				_, body := n.get("/run")
				_, _ = fmt.Sscan(body, &ready, &bCalls, &after, &late)
				return
			}
			testwait.For(30*time.Second, func() bool { r, _, _, _ := run(); return r >= 4 })
			if st, body := n.get("/key"); st != 200 || strings.TrimSpace(body) == "none" {
				t.Fatalf("/key: %d %q", st, body)
			}
			// every worker has called b before the ejection
			testwait.For(30*time.Second, func() bool { _, bc, _, _ := run(); return bc >= 40 })
			if st, body := n.get("/eject"); st != 200 || strings.TrimSpace(body) != "timeout ejected" {
				t.Fatalf("/eject: %d %q, want the call to time out and b ejected", st, body)
			}
			// 200 calls started past the 100 ms: a window measured in calls
			testwait.For(60*time.Second, func() bool { _, _, af, _ := run(); return af >= 200 })
			_, _, after, late := run()
			t.Logf("calls started more than 100 ms after the ejection: %d, of which to b: %d", after, late)
			if after < 200 {
				t.Fatalf("only %d calls after the ejection in 60 s", after)
			}
			if shared && late != 0 {
				t.Errorf("shared pool: %d of %d calls started more than 100 ms after the ejection went to the ejected server", late, after)
			}
			if !shared && late == 0 {
				t.Errorf("unshared pool: no call went to b after one worker ejected it: the test does not tell sharing apart")
			}
		})
	}
}

// TestPoolSharedThrottle: adaptive throttling sheds on every worker's
// window when the pool is shared: one worker's calls are all answered
// with the overload code; the other workers, which saw only answers,
// then shed most of their calls. Unshared, they shed none.
func TestPoolSharedThrottle(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shared", false: "local"}[shared], func(t *testing.T) {
			opt := ""
			if shared {
				opt = `shared = "qpools", `
			}
			n := startNginx(t, ngxConf{Workers: 4, HTTP: sharedPoolsHTTP + "lua_shared_dict qrun 1m;\n",
				InitWorkerByLua: `
        -- worker 0 makes 200 calls answered with the overload code, then
        -- the others make 20 calls each that their servers answer
        ngx.timer.at(0, function()
            local qt = require "qtest"
            local run = ngx.shared.qrun
            local conn, err = require("resty.ffi.qrpc").connect({ qt.addr },
                qt.opts({ ` + opt + `throttle = { k = 2, codes = { 7 } } }))
            if not conn then ngx.log(ngx.ERR, "connect: ", err) return end
            local connected = ngx.now()
            run:incr("ready", 1, 0)
            local me = ngx.worker.id()
            qt.wait(30, function() return run:get("ready") == 4 end)
            if me == 0 then
                for _ = 1, 200 do conn:unary("fail", "") end
                run:set("failed", true)
                return
            end
            -- wait until worker 0's window is in the dict with most of its
            -- calls (it publishes at its steps, every 100 ms while calling)
            local function published()
                if not ` + strconv.FormatBool(shared) + ` then
                    return run:get("failed")
                end
                local d = ngx.shared.qpools
                for _, k in ipairs(d:get_keys(0)) do
                    if k:find(":tr:0$") and tonumber(d:get(k)) >= 150 then
                        return true
                    end
                end
            end
            -- worker 0's window published, and this worker's next sync due
            -- (a pool that takes calls steps at least every 100 ms; its
            -- connect stepped it)
            qt.wait(30, function()
                return published() and ngx.now() >= connected + 0.1
            end)
            for _ = 1, 20 do
                local res, cerr = conn:unary("who", "")
                if res then
                    run:incr("answered", 1, 0)
                elseif cerr == "unavailable: throttled" then
                    run:incr("throttled", 1, 0)
                else
                    ngx.log(ngx.ERR, "call: ", cerr)
                end
            end
        end)`,
				Server: loc("/run", `
                local run = ngx.shared.qrun
                ngx.say(run:get("answered") or 0, " ", run:get("throttled") or 0)`),
			})
			var answered, throttled int
			testwait.For(60*time.Second, func() bool {
				_, body := n.get("/run")
				_, _ = fmt.Sscan(body, &answered, &throttled)
				return answered+throttled >= 60
			})
			t.Logf("the other 3 workers: %d calls answered, %d throttled", answered, throttled)
			if answered+throttled != 60 {
				t.Fatalf("%d calls of the other workers ended, want 60", answered+throttled)
			}
			if shared && throttled < 30 {
				t.Errorf("shared pool: %d of 60 calls throttled after another worker's 200 overloaded answers: want most", throttled)
			}
			if !shared && throttled != 0 {
				t.Errorf("unshared pool: %d calls throttled in workers that saw only answers", throttled)
			}
		})
	}
}

// TestPoolSharedKilledServer: kill -9 of one of three server processes
// under 200 concurrent requests spread over 4 workers sharing the pool:
// summed over the workers, only the calls in flight on it fail (each
// worker's connection hears the port's ICMP refusal at once, as one
// worker's does: TestPoolThreeServers), and none after.
func TestPoolSharedKilledServer(t *testing.T) {
	requireNginx(t)
	srvs, extra := startDemos(t, 3)
	pool := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect({ qt.s1, qt.s2, qt.s3 }, qt.opts({
                        timeout = 5000, shared = "qpools",
                        health = { failures = 3, eject = 60000 },
                    }))
                end
`
	n := startNginx(t, ngxConf{Workers: 4, HTTP: sharedPoolsHTTP, Extra: extra,
		Server:      loc("/slowcall", pool+poolCallLua(`"slow", "20"`)),
		AllowErrors: []string{`qrpc: (re-dial failed|connection lost)`},
	})
	ld := startLoad(t, n, "/slowcall", 200)
	ld.past(t, time.Now(), 2, 30*time.Second, "every client made 2 calls")
	victim := srvs[1]
	killedAt := time.Now()
	victim.kill()
	// every client finished 2 calls begun after the kill: whatever was in
	// flight then has ended, in every worker
	ld.past(t, killedAt, 2, 30*time.Second, "the calls in flight at the kill ended")
	before := len(ld.failures())
	okBefore := ld.oks.Load()
	ld.past(t, time.Now(), 3, 30*time.Second, "3 more calls by every client")
	sample := ld.failures()
	t.Logf("kill -9 under 200 concurrent requests on 4 workers: %d of %d calls failed, %d after",
		before, int(okBefore)+before, len(sample)-before)
	if before == 0 {
		t.Fatal("no call failed: was the server really killed under load?")
	}
	// In flight at the kill: about a third of 200 (each call is 20 ms on
	// the server); at most every client's call, once.
	if before > 200 {
		t.Errorf("%d calls failed: more than the 200 that can be in flight", before)
	}
	if after := len(sample) - before; after != 0 {
		t.Errorf("%d calls failed after every worker's calls in flight at the kill had ended: %v", after, sample[before:])
	}
	// In flight on the victim, a call hears the refusal: "connection lost:
	// refused"; on a loaded machine a call in flight elsewhere may pass
	// its 5 s. Nothing else.
	for _, f := range sample {
		if !strings.HasPrefix(f.err, "connection lost: refused") && f.err != "timeout" {
			t.Errorf("a call failed with %q, want connection lost: refused (in flight)", f.err)
		}
	}
}

// TestPoolSharedFrozenServer: a server frozen (SIGSTOP) under calls from
// 4 workers sharing the pool, with health = { failures = 3, on =
// { "timeout" } }: summed over the workers, its calls time out no more
// than failures + the calls that can be in flight (one per worker here:
// each worker calls in a loop of its own, one call at a time), since the
// run of failures in a row is the instance's: the worker whose timeout
// brings it to 3 ejects the server for all. Unshared, each worker has to
// count 3 of its own: 4 × 3.
func TestPoolSharedFrozenServer(t *testing.T) {
	requireNginx(t)
	const (
		failures = 3
		workers  = 4 // one calling loop each: the calls that can be in flight
	)
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shared", false: "local"}[shared], func(t *testing.T) {
			srvs, extra := startDemos(t, 3)
			opt := ""
			if shared {
				opt = `shared = "qpools", `
			}
			n := startNginx(t, ngxConf{Workers: workers, HTTP: sharedPoolsHTTP + "lua_shared_dict qrun 1m;\n", Extra: extra,
				InitWorkerByLua: `
        -- each worker: one call at a time until told to stop, counting
        -- answers and timeouts; before the timeout is set (warm-up), the
        -- slowest answer; once s2 is frozen, the answers this worker had
        -- when its pool showed s2 ejected
        ngx.timer.at(0, function()
            local qt = require "qtest"
            local run = ngx.shared.qrun
            local me = ngx.worker.id()
            local conn, err = require("resty.ffi.qrpc").connect({ qt.s1, qt.s2, qt.s3 }, qt.opts({ ` + opt + `
                health = { failures = ` + strconv.Itoa(failures) + `, on = { "timeout" }, eject = 600000 } }))
            if not conn then ngx.log(ngx.ERR, "connect: ", err) return end
            run:incr("ready", 1, 0)
            local ejected = false
            for _ = 1, 1000000 do
                if run:get("stop") then break end
                local to = run:get("timeout")
                ngx.update_time()
                local t0 = ngx.now()
                local res, cerr = conn:unary("echo", "x", { timeout = to or 10000 })
                ngx.update_time()
                if res then
                    run:incr("ok:" .. me, 1, 0)
                    local took = ngx.now() - t0
                    if not to and took > (run:get("slowest:" .. me) or 0) then
                        run:set("slowest:" .. me, took)
                    end
                elseif cerr == "timeout" then
                    run:incr("timeouts:" .. me, 1, 0)
                else
                    run:incr("errors", 1, 0)
                    ngx.log(ngx.ERR, "call: ", cerr)
                end
                if not ejected and run:get("frozen") then
                    for _, p in ipairs(conn:peers()) do
                        if p.addr == qt.s2 and p.state == "ejected" then
                            ejected = true
                            run:set("ejected:" .. me, run:get("ok:" .. me) or 0)
                        end
                    end
                end
            end
        end)`,
				Server: loc("/run", `
                local run = ngx.shared.qrun
                for _, k in ipairs(run:get_keys(0)) do
                    ngx.say(k, " ", tostring(run:get(k)))
                end`) + loc("/set", `ngx.shared.qrun:set(ngx.var.arg_k, tonumber(ngx.var.arg_v) or ngx.var.arg_v)`),
			})
			t.Cleanup(func() { n.get("/set?k=stop&v=1") })
			state := func() map[string]float64 {
				_, body := n.get("/run")
				m := map[string]float64{}
				for _, l := range strings.Split(body, "\n") {
					if f := strings.Fields(l); len(f) == 2 {
						m[f[0]], _ = strconv.ParseFloat(f[1], 64)
					}
				}
				return m
			}
			// every worker's key k has reached want(worker)
			all := func(m map[string]float64, k string, want func(id int) float64) bool {
				for id := range workers {
					if v, ok := m[k+":"+strconv.Itoa(id)]; !ok || v < want(id) {
						return false
					}
				}
				return true
			}
			sum := func(m map[string]float64, k string) (total int, each []int) {
				for id := range workers {
					each = append(each, int(m[k+":"+strconv.Itoa(id)]))
					total += each[id]
				}
				return
			}
			wait := func(what string, d time.Duration, cond func(map[string]float64) bool) map[string]float64 {
				t.Helper()
				var m map[string]float64
				testwait.Until(t, what, d, func() bool { m = state(); return cond(m) })
				return m
			}

			// warm-up: 200 answers by every worker; the calls' timeout
			// is then 20 × the slowest of them (ngx.now() counts whole
			// ms: 1 ms at least)
			m := wait("200 answers by every worker", 60*time.Second, func(m map[string]float64) bool {
				return all(m, "ok", func(int) float64 { return 200 })
			})
			slowest := 0.001
			for id := range workers {
				slowest = max(slowest, m["slowest:"+strconv.Itoa(id)])
			}
			timeout := int(math.Ceil(20 * slowest * 1000))
			n.get("/set?k=timeout&v=" + strconv.Itoa(timeout))
			base := m
			m = wait("100 answers by every worker under the timeout", 60*time.Second, func(m map[string]float64) bool {
				return all(m, "ok", func(id int) float64 { return base["ok:"+strconv.Itoa(id)] + 100 })
			})
			if spurious, _ := sum(m, "timeouts"); spurious != 0 || m["errors"] != 0 {
				t.Fatalf("%d timeouts and %v errors before any server was frozen (timeout %d ms, 20 × the slowest warm-up answer)", spurious, m["errors"], timeout)
			}

			victim := srvs[1]
			if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = victim.cmd.Process.Signal(syscall.SIGCONT) })
			n.get("/set?k=frozen&v=1")
			// every worker's pool ejects s2, then makes 100 more answered
			// calls: its call in flight at the ejection (if any) has ended
			m = wait("s2 ejected in every worker", 60*time.Second, func(m map[string]float64) bool {
				return all(m, "ejected", func(int) float64 { return 0 })
			})
			ej := m
			m = wait("100 answers by every worker after the ejection", 60*time.Second, func(m map[string]float64) bool {
				return all(m, "ok", func(id int) float64 { return ej["ejected:"+strconv.Itoa(id)] + 100 })
			})
			total, each := sum(m, "timeouts")
			t.Logf("s2 frozen, %d workers calling, timeout %d ms (slowest warm-up answer %.0f ms): %d timeouts (by worker %v), %v other errors",
				workers, timeout, slowest*1000, total, each, m["errors"])
			if shared {
				if total == 0 {
					t.Fatal("no call timed out: was the server frozen under the calls?")
				}
				if total > failures+workers {
					t.Errorf("shared pool: %d timeouts summed over the workers, want at most failures (%d) + the calls in flight (%d)",
						total, failures, workers)
				}
			} else {
				if total <= failures+workers {
					t.Errorf("unshared pool: %d timeouts, not more than the shared bound %d: the test does not tell sharing apart", total, failures+workers)
				}
				for id, c := range each {
					if c < failures {
						t.Errorf("unshared pool: worker %d ejected s2 after %d timeouts, want its own %d", id, c, failures)
					}
				}
			}
		})
	}
}

// TestPoolsDictDefault: configure{ pools_dict } alone keeps the settings
// given before it (the library's path: reset, the library would not be
// found and no call would work) and makes every connect
// that names no dict shared through it; shared = false opts out; a dict
// that does not exist is refused.
func TestPoolsDictDefault(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, HTTP: sharedPoolsHTTP,
		InitWorkerByLua: `assert(require("resty.ffi.qrpc").configure{ pools_dict = "qpools" })`,
		Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function keys()
                    local n = 0
                    for _, k in ipairs(ngx.shared.qpools:get_keys(0)) do
                        if k:find("^qrpc:") then n = n + 1 end
                    end
                    return n
                end
                -- a pool with a check takes the probe lease when shared
                local check = { method = "echo", interval = 1000 }
                local conn = assert(qt.connect({ shared = false, check = check }))
                assert(conn:unary("echo", "x"))
                ngx.say("opted out: ", keys())
                conn = assert(qt.connect({ check = check }))
                assert(conn:unary("echo", "x"))
                ngx.say("default: ", keys() > 0)
                ngx.say(select(2, qt.connect({ shared = "nope" })))
                ngx.say(select(2, qrpc.configure{ pools_dict = "nope" }))`),
	})
	st, body := n.get("/t")
	want := "opted out: 0\ndefault: true\n" +
		"bad argument #2: shared: no lua_shared_dict named 'nope'\n" +
		"bad argument #1: pools_dict: no lua_shared_dict named 'nope'\n"
	if st != 200 || body != want {
		t.Errorf("/t: %d\n%s\nwant\n%s", st, body, want)
	}
}

// TestCachedConnectChecksOptions: a connect whose options match a cached
// connection still refuses an unknown option name and a boolean option of
// the wrong type.
func TestCachedConnectChecksOptions(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qt = require "qtest"
                assert(qt.connect({ insecure = true }))
                ngx.say(select(2, qt.connect({ insecure = true, tiemout = 100 })))
                ngx.say(select(2, qt.connect({ insecure = "yes" })))
                assert(qt.connect({ propagate_deadline = false }))
                ngx.say(select(2, qt.connect({ propagate_deadline = 0 })))`)})
	st, body := n.get("/t")
	want := "bad argument #2: unknown option 'tiemout'\n" +
		"bad argument #2: insecure must be a boolean (got string)\n" +
		"bad argument #2: propagate_deadline must be a boolean (got number)\n"
	if st != 200 || body != want {
		t.Errorf("/t: %d\n%s\nwant\n%s", st, body, want)
	}
}
