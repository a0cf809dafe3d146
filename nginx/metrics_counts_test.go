package nginx

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// callsLoc: /hcall?m=<method>&b=<body>&n=<count>: makes n unary calls on
// the connection of the snippet's pool() and prints one line per call:
// "ok <code>" or "err <err> | attempts=<n> budget=<b>".
func callsLoc(path, poolLuaSrc string) string {
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

const metricsScrapeLoc = `
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

func countPrefixed(body, prefix string) int {
	n := 0
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

type callTally struct {
	mu       sync.Mutex
	calls    int
	attempts int // sum over calls of their attempts, as the client saw them
	retried  int // sum of attempts-1
	budget   int
	errs     map[string]int
}

func (h *callTally) add(body string) {
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

const callAttemptsLua = `
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

// TestCallsCountedWhenServerDown: a connection to one server whose
// process was killed: every later call fails, most of them refused at once
// by the connection that is down ("unavailable: refused"). Each chose its
// server, so each is one attempt in qrpc_client_calls_total (metrics.md:
// only a call that fails before any server is chosen is not counted).
func TestCallsCountedWhenServerDown(t *testing.T) {
	requireNginx(t)
	srvs, extra := startDemos(t, 1)
	pl := `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect(qt.s1, qt.opts({ timeout = 1000 }))
                end
`
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra, Server: callsLoc("/hcall", pl) + metricsScrapeLoc,
		AllowErrors: []string{`qrpc: `}})
	st, body := n.get("/hcall?n=5")
	t.Logf("before: %d %s", st, body)
	srvs[0].kill()
	time.Sleep(200 * time.Millisecond)
	st, body = n.get("/hcall?n=10")
	t.Logf("after kill: %d %s", st, body)
	fails := countPrefixed(body, "err ")
	m, text := scrape(t, n)
	total := metricSum(m, "qrpc_client_calls_total", `method="greet"`)
	notOK := total - metricSum(m, "qrpc_client_calls_total", `method="greet"`, `result="ok"`)
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "qrpc_client_calls_total") && !strings.HasSuffix(l, " 0") || strings.HasPrefix(l, "qrpc_client_connections") && !strings.HasSuffix(l, " 0") {
			t.Log(l)
		}
	}
	if d := metricSum(m, "qrpc_client_call_duration_seconds_count", `method="greet"`); d != total {
		t.Errorf("the duration histogram counts %v attempts, qrpc_client_calls_total %v", d, total)
	}
	if int(notOK) != fails {
		t.Errorf("%d calls failed, qrpc_client_calls_total counts %v failed attempts (of %v)", fails, notOK, total)
	}
}

// TestEventFailoverCountedOnce: an event one server of a pool refuses
// (its send queue is full) goes to another and is sent: the caller gets
// true. qrpc_client_events_total has one outcome per event: an event sent
// by the second server is not also dropped on the first, and one every
// server refused is dropped once, not once per server.
func TestEventFailoverCountedOnce(t *testing.T) {
	requireNginx(t)
	a, err := newTestServerCfg("127.0.0.1:0", nil, qrpc.ServerConfig{MaxHandlers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.release(); _ = a.close() })
	b := ownServer(t)
	b.release() // b's "block" handler returns at once: b keeps reading
	n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"sa": a.addr, "sb": b.addr},
		Server: metricsScrapeLoc + loc("/t", `
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

// TestReloadCountsDrainedCalls: metrics.md: with metrics_dict every
// worker adds what it counted into the dict "once a second ... and when
// it exits", and "Counters survive nginx -s reload". A call that a
// gracefully exiting worker finishes after the reload is counted; the
// old worker's gauges stay in the sums while it drains and leave them
// when it exits.
func TestReloadCountsDrainedCalls(t *testing.T) {
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
		Server:          callsLoc("/hcall", pl) + metricsScrapeLoc,
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
	time.Sleep(700 * time.Millisecond) // the old worker drains its call
	m, _ := scrape(t, n)
	if v := metricSum(m, "qrpc_client_inflight"); v != 1 {
		t.Errorf("qrpc_client_inflight = %v while the old worker drains its call, want 1", v)
	}
	body := <-done
	t.Logf("the call in flight across the reload: %s", strings.TrimSpace(body))
	if !strings.HasPrefix(body, "ok 0") {
		t.Fatalf("the call in flight across the reload failed: %s", body)
	}
	time.Sleep(2500 * time.Millisecond) // the old worker has exited, new ones flushed
	m, _ = scrape(t, n)
	got := metricSum(m, "qrpc_client_calls_total", `method="slow"`, `result="ok"`)
	if got != 1 {
		t.Errorf("qrpc_client_calls_total{method=\"slow\",result=\"ok\"} = %v after the reload; the call answered, want 1", got)
	}
	if v := metricSum(m, "qrpc_client_calls_total", `method="greet"`, `result="ok"`); v != 1 {
		t.Errorf("greet ok = %v, want 1", v)
	}
	// The new worker has dialled nothing: what remains would be the old one's.
	if v := metricSum(m, "qrpc_client_inflight"); v != 0 {
		t.Errorf("qrpc_client_inflight = %v after the old worker exited, want 0", v)
	}
	if v := metricSum(m, "qrpc_client_connections"); v != 0 {
		t.Errorf("qrpc_client_connections sums to %v after the old worker exited, want 0", v)
	}
}
