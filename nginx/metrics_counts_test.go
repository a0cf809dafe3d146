package nginx

import (
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
