package nginx

import (
	"strconv"
	"strings"
	"testing"
)

// luaRun is a location that runs the Lua in the request body, with qrpc
// and the test module qt in scope.
const luaRun = `
                ngx.req.read_body()
                local code = ngx.req.get_body_data()
                local f, err = loadstring("local qrpc = require 'resty.ffi.qrpc'; local qt = require 'qtest'; " .. code)
                if not f then ngx.status = 500; ngx.say("compile: ", err); return end
                local ok, e = pcall(f)
                if not ok then ngx.status = 500; ngx.say("error: ", e) end`

// runLua runs lua in nginx's /run location (luaRun) and returns the body.
func runLua(t *testing.T, n *nginxProc, lua string) string {
	t.Helper()
	st, body, _, err := n.do("POST", "/run", lua)
	if err != nil || st != 200 {
		t.Fatalf("/run: %d %v\n%s", st, err, body)
	}
	return body
}

// workerMetrics is qrpc.metrics() of the worker that answers (no
// metrics_dict: its own figures, at once), as series -> value.
func workerMetrics(t *testing.T, n *nginxProc) map[string]int {
	t.Helper()
	body := runLua(t, n, `ngx.print(assert(qrpc.metrics()))`)
	out := map[string]int{}
	for _, l := range strings.Split(body, "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if sp < 0 || err != nil {
			t.Fatalf("bad metrics line %q", l)
		}
		out[l[:sp]] = int(v)
	}
	return out
}

// sumSeries adds the series of family whose labels contain every one of
// labels.
func sumSeries(m map[string]int, family string, labels ...string) int {
	s := 0
outer:
	for k, v := range m {
		if !strings.HasPrefix(k, family+"{") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(k, l) {
				continue outer
			}
		}
		s += v
	}
	return s
}

func luaRunNginx(t *testing.T, extra map[string]string) *nginxProc {
	return startNginx(t, ngxConf{Workers: 1, Extra: extra, Server: loc("/run", luaRun), AllowErrors: []string{`qrpc`}})
}

// TestHedgeLosersNotCounted: every server answers in 20 ms and copies go
// out after 1 ms, so each call sends one; the first answer wins and the
// other copy is cancelled. pools.md: the cancelled copies "are no verdict
// on their servers"; metrics.md: a cancelled attempt is not counted in
// qrpc_client_calls_total (nor its duration), while each copy sent is in
// qrpc_client_retries_total{reason="hedge"}. So 40 calls all answered
// count 40 results "ok" (a copy whose answer came before it could be
// cancelled is an answer too) and nothing else.
func TestHedgeLosersNotCounted(t *testing.T) {
	_, extra := startDemos(t, 3)
	n := luaRunNginx(t, extra)
	body := runLua(t, n, `
local c = assert(qrpc.connect({ qt.s1, qt.s2, qt.s3 }, qt.opts({ hedge = { delay = 1 }, budget = { ratio = 1, min_per_s = 100 } })))
local ok, bad = 0, 0
for i = 1, 40 do local r, e = c:unary("slow", "20"); if r and r.code == 0 then ok = ok + 1 else bad = bad + 1 end end
ngx.say("ok=", ok, " failed=", bad)
`)
	if strings.TrimSpace(body) != "ok=40 failed=0" {
		t.Fatalf("calls: %s", body)
	}
	m := workerMetrics(t, n)
	const slow = `method="slow"`
	copies := sumSeries(m, "qrpc_client_retries_total", `reason="hedge"`)
	ok := sumSeries(m, "qrpc_client_calls_total", slow, `result="ok"`)
	all := sumSeries(m, "qrpc_client_calls_total", slow)
	durations := sumSeries(m, "qrpc_client_call_duration_seconds_count", slow)
	t.Logf("40 calls: %d copies sent; calls_total %d (ok %d), durations %d", copies, all, ok, durations)
	if copies == 0 {
		t.Fatal("no copy sent: the test shows nothing")
	}
	if all != ok {
		for k, v := range m {
			if strings.HasPrefix(k, "qrpc_client_calls_total{") && strings.Contains(k, slow) && v != 0 {
				t.Log(k, v)
			}
		}
		t.Errorf("40 calls all answered: %d results other than ok in qrpc_client_calls_total (cancelled copies counted)", all-ok)
	}
	if ok < 40 || ok > 40+copies {
		t.Errorf("%d results ok, want 40 to %d (40 answers, and copies answered before their cancel)", ok, 40+copies)
	}
	if durations != all {
		t.Errorf("qrpc_client_call_duration_seconds_count %d, qrpc_client_calls_total %d: the histogram counts other attempts", durations, all)
	}
}

// TestHedgeP95From20Answers: pools.md: delay = "p95" follows the pool's
// measured 95th percentile answer time, "no copy until the pool has 20
// answers to measure". After 19 answers of 5 ms a call of 300 ms sends no
// copy; after 20 it sends one.
func TestHedgeP95From20Answers(t *testing.T) {
	_, extra := startDemos(t, 3)
	n := luaRunNginx(t, extra)
	body := runLua(t, n, `
local function copies()
  local m = assert(qrpc.metrics()); local s = 0
  for v in m:gmatch('reason="hedge"} (%d+)') do s = s + tonumber(v) end
  return s
end
for _, warm in ipairs({ 19, 20 }) do
  -- a pool of its own (another timeout): its own answers
  local c = assert(qrpc.connect({ qt.s1, qt.s2, qt.s3 }, qt.opts({ timeout = 3000 + warm, hedge = { delay = "p95" }, budget = { ratio = 1, min_per_s = 1000 } })))
  for i = 1, warm do assert(c:unary("slow", "5")) end
  local base = copies()
  assert(c:unary("slow", "300"))
  ngx.say(warm, " answers: ", copies() - base, " copies")
end
`)
	t.Logf("%s", body)
	if !strings.Contains(body, "19 answers: 0 copies") {
		t.Errorf("a copy before the pool had 20 answers:\n%s", body)
	}
	if !strings.Contains(body, "20 answers: 1 copies") {
		t.Errorf("no copy for a call 60 times the p95 once the pool had 20 answers:\n%s", body)
	}
}
