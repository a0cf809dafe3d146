package nginx

import (
	"fmt"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// huntCallLoc: /hcall?m=<method>&b=<body>&n=<count>: makes n unary calls on
// the connection of the snippet's pool() and prints one line per call:
// "ok <code>" or "err <err> | attempts=<n> budget=<b>".
func huntCallLoc(path, poolLuaSrc string) string {
	return loc(path, poolLuaSrc+`
                local conn, err = pool()
                if not conn then
                    ngx.say("connect: ", err)
                    return
                end
                local args = ngx.req.get_uri_args()
                local n = tonumber(args.n) or 1
                for _ = 1, n do
                    local res, e, info = conn:unary(args.m or "greet", args.b or "x")
                    if res then
                        ngx.say("ok ", res.code)
                    else
                        ngx.say("err ", tostring(e), " | attempts=", tostring(info and info.attempts),
                                " budget=", tostring(info and info.budget), " detail=", tostring(info and info.detail))
                    end
                end`)
}

const huntMetricsLoc = `
        location = /metrics {
            content_by_lua_block {
                local text, err = require("resty.ffi.qrpc").metrics()
                if not text then
                    ngx.status = 500
                    ngx.say("metrics: ", err)
                    return
                end
                ngx.print(text)
            }
        }
`

func countLines(body, prefix string) int {
	n := 0
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// TestHuntOneServerDownCounted: a connection to one server whose process
// was killed: every call fails; metrics.md says qrpc_client_calls_total
// counts the attempts with result connect/unavailable/connection_lost...
func TestHuntOneServerDownCounted(t *testing.T) {
	requireNginx(t)
	srvs, extra := startDemos(t, 1)
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect(qt.s1, qt.opts({ timeout = 1000 }))
                end
`
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra, Server: huntCallLoc("/hcall", pl) + huntMetricsLoc,
		AllowErrors: []string{`qrpc: `}})
	st, body := n.get("/hcall?n=5")
	t.Logf("before: %d %s", st, body)
	srvs[0].kill()
	time.Sleep(200 * time.Millisecond)
	st, body = n.get("/hcall?n=10")
	t.Logf("after kill: %d %s", st, body)
	fails := countLines(body, "err ")
	m, text := scrape(t, n)
	total := metricSum(m, "qrpc_client_calls_total", `method="greet"`)
	notOK := total - metricSum(m, "qrpc_client_calls_total", `method="greet"`, `result="ok"`)
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "qrpc_client_calls_total") && !strings.HasSuffix(l, " 0") || strings.HasPrefix(l, "qrpc_client_connections") && !strings.HasSuffix(l, " 0") {
			t.Log(l)
		}
	}
	if int(notOK) != fails {
		t.Errorf("%d calls failed, qrpc_client_calls_total counts %v failed attempts (of %v)", fails, notOK, total)
	}
	_ = fmt.Sprint
}

type huntTally struct {
	mu       sync.Mutex
	calls    int
	attempts int // sum over calls of their attempts, as the client saw them
	retried  int // sum of attempts-1
	budget   int
	errs     map[string]int
}

func (h *huntTally) add(body string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		h.calls++
		f := strings.Fields(l)
		switch {
		case len(f) == 3 && f[0] == "ok":
			a := atoi(f[2])
			h.attempts += a
			h.retried += a - 1
		case strings.HasPrefix(l, "err "):
			e, rest, _ := strings.Cut(strings.TrimPrefix(l, "err "), " | ")
			h.errs[e]++
			a := 1
			if m := regexp.MustCompile(`attempts=(\d+)`).FindStringSubmatch(rest); m != nil {
				a = atoi(m[1])
			}
			h.attempts += a
			h.retried += a - 1
			if strings.Contains(rest, "budget=true") {
				h.budget++
			}
		default:
			h.errs["?"+l]++
		}
	}
}

const huntCallAttemptsLua = `
                local conn, err = pool()
                if not conn then
                    ngx.say("connect: ", err)
                    return
                end
                local args = ngx.req.get_uri_args()
                local n = tonumber(args.n) or 1
                for _ = 1, n do
                    local res, e, info = conn:unary(args.m or "greet", args.b or "x")
                    if res then
                        ngx.say("ok ", res.code, " ", res.attempts)
                    else
                        ngx.say("err ", tostring(e), " | attempts=", tostring(info and info.attempts),
                                " budget=", tostring(info and info.budget))
                    end
                end`

// TestHuntNamedShareDifferentNames: two pools of different DNS names,
// shared under one name (shared = { dict, name }), both re-resolving: a
// call through each must go to a server its own name resolves to.
func TestHuntNamedShareDifferentNames(t *testing.T) {
	requireNginx(t)
	a, b := ownServer(t), ownServer(t)
	_, pa, _ := net.SplitHostPort(a.addr)
	_, pb, _ := net.SplitHostPort(b.addr)
	dns := dnstest.Start(t, "a.qrpc.test.")
	dns.SetA("a.qrpc.test.", "127.0.0.1")
	dns.SetA("b.qrpc.test.", "127.0.0.1")
	extra := map[string]string{"na": "a.qrpc.test:" + pa, "nb": "b.qrpc.test:" + pb, "dns": dns.Addr}
	mk := func(which string) string {
		return `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect(qt.` + which + `, qt.opts({ resolve = 200, resolver = qt.dns, timeout = 1000,
                        shared = { dict = "qrpc_pools", name = "orders" } }))
                end` + poolCallLua(`"who", ""`)
	}
	n := startNginx(t, ngxConf{Workers: 2, Extra: extra, HTTP: "    lua_shared_dict qrpc_pools 1m;\n",
		Server: loc("/a", mk("na")) + loc("/b", mk("nb")), AllowErrors: []string{`qrpc: `}})
	wrong := map[string]int{}
	for i := range 60 {
		for _, c := range []struct{ path, want string }{{"/a", a.addr}, {"/b", b.addr}} {
			st, body := n.get(c.path)
			body = strings.TrimSpace(body)
			if st != 200 || body != c.want {
				wrong[fmt.Sprintf("%s -> %d %s", c.path, st, body)]++
			}
		}
		if i%10 == 0 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	if len(wrong) > 0 {
		t.Errorf("calls went to a server their pool's name does not resolve to: %v (a=%s b=%s)", wrong, a.addr, b.addr)
	}
}

// TestHuntExpiredLabels: qrpc_client_deadline_expired_total's method
// label is bounded as metrics.md says of every label ("method names are
// cut to 128 bytes"), and the exposition stays valid UTF-8 (promtool).
func TestHuntExpiredLabels(t *testing.T) {
	requireNginx(t)
	n := startNginx(t, ngxConf{Workers: 1, Server: huntMetricsLoc + loc("/late", connectT+`
                for _, m in ipairs({ string.rep("m", 200), "bad\255name" }) do
                    local res, e, info = conn:unary(m, "x", { deadline = ngx.now() - 1 })
                    ngx.say(tostring(res), " ", tostring(e), " ", tostring(info and info.attempts))
                    res, e = conn:unary(m, "x")
                    ngx.say(tostring(res and res.code), " ", tostring(e))
                end`)})
	st, body := n.get("/late")
	t.Logf("/late: %d %s", st, body)
	_, text := scrape(t, n)
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "qrpc_client_deadline_expired_total{") {
			t.Logf("%.120q", l)
		}
		if strings.HasPrefix(l, "qrpc_client_deadline_expired_total{") && strings.Contains(l, strings.Repeat("m", 129)) {
			t.Errorf("method label longer than 128 bytes: %.80s...", l)
		}
	}
	if !utf8.ValidString(text) {
		t.Error("the exposition is not valid UTF-8")
	}
	promtoolCheck(t, text)
}

// TestHuntReloadKeepsDrainedCalls: metrics.md: with metrics_dict every
// worker adds what it counted into the dict "once a second ... and when
// it exits", and "Counters survive nginx -s reload". Calls that a
// gracefully exiting worker finishes after the reload are counted.
func TestHuntReloadKeepsDrainedCalls(t *testing.T) {
	requireNginx(t)
	_, extra := startDemos(t, 1)
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect(qt.s1, qt.opts({ timeout = 10000 }))
                end
`
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra,
		HTTP:            "    lua_shared_dict qrpc_metrics 4m;\n",
		InitWorkerByLua: `assert(require("resty.ffi.qrpc").configure{ metrics_dict = "qrpc_metrics" })`,
		Server:          huntCallLoc("/hcall", pl) + huntMetricsLoc,
		AllowErrors:     []string{`qrpc: `}})
	// A first call loads the library and starts the flush timer.
	if _, body := n.get("/hcall?m=greet"); !strings.HasPrefix(body, "ok 0") {
		t.Fatalf("/hcall: %s", body)
	}
	done := make(chan string)
	go func() {
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Get(n.url("/hcall?m=slow&b=3000&n=1"))
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	time.Sleep(1500 * time.Millisecond) // the call is in flight, a flush has passed
	n.signal("reload")
	body := <-done
	t.Logf("the call in flight across the reload: %s", strings.TrimSpace(body))
	if !strings.HasPrefix(body, "ok 0") {
		t.Fatalf("the call in flight across the reload failed: %s", body)
	}
	time.Sleep(2500 * time.Millisecond) // the old worker has exited, new ones flushed
	m, _ := scrape(t, n)
	got := metricSum(m, "qrpc_client_calls_total", `method="slow"`, `result="ok"`)
	if got != 1 {
		t.Errorf("qrpc_client_calls_total{method=\"slow\",result=\"ok\"} = %v after the reload; the call answered, want 1", got)
	}
	if v := metricSum(m, "qrpc_client_calls_total", `method="greet"`, `result="ok"`); v != 1 {
		t.Errorf("greet ok = %v, want 1", v)
	}
}

// TestHuntEventFailoverCountedOnce: an event one server of a pool
// refuses (its send queue is full) goes to another and is sent: the
// caller gets true. metrics.md: qrpc_client_events_total counts
// "events: sent, or dropped (not sent: queue full, unavailable, ...)".
// An event that was sent must not also count as dropped.
func TestHuntEventFailoverCountedOnce(t *testing.T) {
	requireNginx(t)
	a, err := newTestServerCfg("127.0.0.1:0", nil, qrpc.ServerConfig{MaxHandlers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.release(); _ = a.close() })
	b := ownServer(t)
	b.release() // b's "block" handler returns at once: b keeps reading
	n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"sa": a.addr, "sb": b.addr},
		Server: huntMetricsLoc + loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect({ qt.sa, qt.sb }, qt.opts({ streams = 1 })))
                local chunk = {}
                for i = 1, 1024 * 1024 do chunk[i] = string.char(math.random(0, 255)) end
                local body = table.concat(chunk)
                local sent, refused = 0, 0
                for i = 1, 60 do
                    local ok, err = conn:event("block", body)
                    if ok then sent = sent + 1 else refused = refused + 1 end
                end
                ngx.say(sent, " ", refused)`), AllowErrors: []string{`qrpc: `}})
	st, body := n.get("/t")
	f := strings.Fields(body)
	if st != 200 || len(f) != 2 {
		t.Fatalf("/t: %d %s", st, body)
	}
	sent, refused := atoi(f[0]), atoi(f[1])
	m, text := scrape(t, n)
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "qrpc_client_events_total") {
			t.Log(l)
		}
	}
	mSent := metricSum(m, "qrpc_client_events_total", `result="sent"`)
	mDropped := metricSum(m, "qrpc_client_events_total", `result="dropped"`)
	t.Logf("callers: %d sent, %d refused; metrics: %v sent, %v dropped", sent, refused, mSent, mDropped)
	if int(mSent) != sent || int(mDropped) != refused {
		t.Errorf("qrpc_client_events_total: %v sent, %v dropped; the caller had %d events sent (true) and %d refused",
			mSent, mDropped, sent, refused)
	}
}
