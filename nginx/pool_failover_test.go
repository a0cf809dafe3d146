package nginx

// Pool failover from outside: SRV priority tiers and active checks
// against real server processes.

import (
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPoolSRVTierFailover: an SRV name with two priorities, real server
// processes: calls go to the first tier; kill -9 of it moves them to the
// second; restarted, the first takes them back.
func TestPoolSRVTierFailover(t *testing.T) {
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

// TestPoolCheckEjectsStoppedServer: with check and no traffic, a SIGSTOPped
// server is ejected by its failed checks, and the first check it answers
// after SIGCONT brings it back (pools.md: "a failure counts as a passive
// failure, any answer brings an ejected server back at once").
func TestPoolCheckEjectsStoppedServer(t *testing.T) {
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
