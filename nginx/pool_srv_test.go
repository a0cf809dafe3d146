package nginx

import (
	"math"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
)

// TestPoolSRVAndThrottleLua: a pool named by an SRV record (given as a
// plain string, and in a list) spreads calls by the records' weights,
// from the test's own DNS server; adaptive throttling refuses calls
// locally with unavailable: throttled once a server answers only its
// overload code, and the metric counts them.
func TestPoolSRVAndThrottleLua(t *testing.T) {
	a, b := ownServer(t), ownServer(t)
	port := func(addr string) uint16 {
		_, p, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(p)
		return uint16(n)
	}
	const name = "_qrpc._udp.svc.qrpc.test."
	dns := dnstest.Start(t, name)
	dns.SetA("a.qrpc.test.", "127.0.0.1")
	dns.SetA("b.qrpc.test.", "127.0.0.1")
	dns.SetSRV(name,
		dnstest.SRV{Priority: 10, Weight: 3, Port: port(a.addr), Target: "a.qrpc.test."},
		dnstest.SRV{Priority: 10, Weight: 1, Port: port(b.addr), Target: "b.qrpc.test."})
	const calls = 400
	n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"dns": dns.Addr, "srv": "_qrpc._udp.svc.qrpc.test"},
		Server: loc("/srv", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local addr = ngx.var.arg_list and { qt.srv } or qt.srv
                local conn, err = qrpc.connect(addr, qt.opts({ resolver = qt.dns }))
                if not conn then ngx.say("connect: ", err) return end
                local hits = {}
                for _ = 1, `+strconv.Itoa(calls)+` do
                    local res, cerr = conn:unary("who", "")
                    if not res then ngx.say("call: ", cerr) return end
                    hits[res.body] = (hits[res.body] or 0) + 1
                end
                for k, v in pairs(hits) do ngx.say(k, " ", v) end`) + loc("/throttle", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qrpc.connect({ qt.addr }, qt.opts({ throttle = { k = 2, codes = { 7 } } }))
                if not conn then ngx.say("connect: ", err) return end
                local answered, throttled = 0, 0
                for _ = 1, 200 do
                    local res, cerr = conn:unary("fail", "")
                    if res then
                        answered = answered + 1
                    elseif cerr == "unavailable: throttled" then
                        throttled = throttled + 1
                    else
                        ngx.say("call: ", cerr) return
                    end
                end
                ngx.say(answered, " ", throttled)`) + loc("/badthrottle", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                for _, th in ipairs({ 2, { k = 0.5 }, { k = 2, codes = { 0 } }, { codes = { 7 } }, { k = 2, x = 1 } }) do
                    local conn, err = qrpc.connect({ qt.addr }, qt.opts({ throttle = th }))
                    ngx.say(conn and "ok" or err)
                end`) + loc("/metrics", `ngx.print(require("resty.ffi.qrpc").metrics())`)})

	for _, q := range []string{"", "?list=1"} {
		st, body := n.get("/srv" + q)
		if st != 200 {
			t.Fatalf("/srv%s: %d %s", q, st, body)
		}
		got := map[string]int{}
		for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
			k, v, _ := strings.Cut(l, " ")
			got[k], _ = strconv.Atoi(v)
		}
		// 3:1 by weight: a's share within 5 binomial standard deviations
		sd := math.Sqrt(calls * 0.75 * 0.25)
		if got[a.addr]+got[b.addr] != calls || math.Abs(float64(got[a.addr])-0.75*calls) > 5*sd {
			t.Errorf("/srv%s: %v, want %d calls split 3:1 between %s and %s (±%.0f)", q, got, calls, a.addr, b.addr, 5*sd)
		}
	}

	st, body := n.get("/throttle")
	var answered, throttled int
	if f := strings.Fields(body); st == 200 && len(f) == 2 {
		answered, _ = strconv.Atoi(f[0])
		throttled, _ = strconv.Atoi(f[1])
	}
	// with no accept, the share refused is (requests - 0) / (requests + 1):
	// past the first few calls nearly every one
	if answered+throttled != 200 || throttled < 100 {
		t.Errorf("/throttle: %d %q, want 200 calls and most of them throttled", st, body)
	}
	_, metrics := n.get("/metrics")
	if !strings.Contains(metrics, `qrpc_client_throttled_total{method="fail"} `+strconv.Itoa(throttled)) {
		t.Errorf("metrics do not count %d throttled calls:\n%s", throttled, grepLines(metrics, "throttled"))
	}

	_, body = n.get("/badthrottle")
	want := []string{
		"bad argument #2: throttle must be a table",
		"bad argument #2: throttle.k must be 0 (off) or a number 1..1000000 (got 0.5)",
		"bad argument #2: throttle.codes[1] must be a code 1..4294967295, each once (got 0)",
		"bad argument #2: throttle.k must be 0 (off) or a number 1..1000000 (got nil)",
		"bad argument #2: unknown throttle option 'x'",
	}
	got := strings.Split(strings.TrimSpace(body), "\n")
	for i := range want {
		if i >= len(got) || !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("/badthrottle %d: %q, want %q", i, got, want[i])
			break
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
