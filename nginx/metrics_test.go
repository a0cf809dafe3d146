package nginx

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// metricsConf: two workers, the dict, /call making unary calls and
// /metrics serving qrpc.metrics().
func metricsConf(extra ngxConf) ngxConf {
	c := extra
	c.Workers = 2
	c.HTTP += "    lua_shared_dict qrpc_metrics 1m;\n"
	c.InitWorkerByLua += `
        assert(require("resty.ffi.qrpc").configure{ metrics_dict = "qrpc_metrics" })`
	c.Server += loc("/call", connectT+`
                local args = ngx.req.get_uri_args()
                local n = tonumber(args.n) or 1
                local res, err
                for _ = 1, n do
                    res, err = conn:unary(args.m or "greet", "x")
                    if not res then
                        ngx.say("error: ", err)
                        return
                    end
                end
                ngx.say(ngx.worker.pid(), " ", res.code)`) +
		loc("/metrics", `
                local text, err = require("resty.ffi.qrpc").metrics()
                if not text then
                    ngx.status = 500
                    ngx.say("metrics: ", err)
                    return
                end
                ngx.header["Content-Type"] = "text/plain; version=0.0.4"
                ngx.print(text)`)
	return c
}

// scrape fetches /metrics and parses it into series -> value.
func scrape(t *testing.T, n *nginxProc) (map[string]float64, string) {
	t.Helper()
	st, body := n.get("/metrics")
	if st != 200 {
		t.Fatalf("/metrics: %d %s", st, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if sp < 0 || err != nil {
			t.Fatalf("bad line %q", line)
		}
		out[line[:sp]] = v
	}
	return out, body
}

// spread sends GETs on fresh connections until both workers have served
// at least one and total calls of method m are made; it returns the calls
// made by each worker pid.
func spread(t *testing.T, n *nginxProc, m string, total int) map[string]int {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	byPID := map[string]int{}
	made := 0
	for i := 0; made < total || len(byPID) < 2; i++ {
		if i >= 400 {
			t.Fatalf("after %d requests only workers %v answered", i, byPID)
		}
		per := min(3, max(total-made, 1))
		resp, err := client.Get(n.url(fmt.Sprintf("/call?m=%s&n=%d", m, per)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		f := strings.Fields(string(b))
		if len(f) != 2 || f[0] == "error:" {
			t.Fatalf("/call: %q", b)
		}
		byPID[f[0]] += per
		made += per
	}
	return byPID
}

func callsOf(byPID map[string]int) int {
	s := 0
	for _, v := range byPID {
		s += v
	}
	return s
}

// TestMetricsAcrossWorkers: calls from two workers add up exactly in
// qrpc.metrics() once the flush interval has passed; the histogram's
// count equals the calls; promtool accepts the output; after a reload the
// counters stay and the old workers' gauges are gone.
func TestMetricsAcrossWorkers(t *testing.T) {
	t.Parallel()
	srv := ownServer(t)
	// /gauges: each worker's gauges in the dict with their time to live;
	// every flush sets them again (metrics.lua), so a longer one than
	// before means that worker has flushed since.
	n := startNginx(t, metricsConf(ngxConf{QServer: srv, Server: loc("/gauges", `
                local d = ngx.shared.qrpc_metrics
                for _, k in ipairs(d:get_keys(0)) do
                    local pid = k:match("^g(%d+) ")
                    local ttl = pid and d:ttl(k)
                    if ttl then
                        ngx.say(pid, " ", ttl)
                    end
                end`)}))
	gaugeTTL := func() map[string]float64 {
		_, b := n.get("/gauges")
		m := map[string]float64{}
		for _, l := range strings.Split(strings.TrimSpace(b), "\n") {
			if pid, v, ok := strings.Cut(l, " "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				m[pid] = max(m[pid], f)
			}
		}
		return m
	}
	greet := callsOf(spread(t, n, "greet", 40))
	fail := callsOf(spread(t, n, "fail", 6))
	server := srv.addr
	okKey := `qrpc_client_calls_total{method="greet",server="` + server + `",result="ok"}`
	codeKey := `qrpc_client_calls_total{method="fail",server="` + server + `",result="code"}`
	var got map[string]float64
	var body string
	if !testwait.For(15*time.Second, func() bool {
		got, body = scrape(t, n)
		return got[okKey] == float64(greet) && got[codeKey] == float64(fail)
	}) {
		t.Fatalf("after 15 s: %s = %v (want %d), %s = %v (want %d)\n%s", okKey, got[okKey], greet, codeKey, got[codeKey], fail, body)
	}
	// Exact, and stays exact: a flush by every worker after that changes
	// nothing.
	ttl0 := gaugeTTL()
	if len(ttl0) != 2 {
		t.Fatalf("gauges of %d workers in the dict, want 2: %v", len(ttl0), ttl0)
	}
	// A flush shows as a TTL that grew since the previous reading (a
	// reading taken in the flush's own millisecond equals the full TTL,
	// and no later one exceeds it: compare each reading with the last).
	prev, flushed := ttl0, map[string]bool{}
	testwait.Until(t, "a flush by every worker", 15*time.Second, func() bool {
		ttl := gaugeTTL()
		for pid, v := range prev {
			if ttl[pid] > v {
				flushed[pid] = true
			}
		}
		prev = ttl
		return len(flushed) == len(ttl0)
	})
	got, body = scrape(t, n)
	labels := `method="greet",server="` + server + `"`
	checks := map[string]float64{
		okKey:   float64(greet),
		codeKey: float64(fail),
		`qrpc_client_calls_total{` + labels + `,result="timeout"}`:                       0,
		`qrpc_client_call_duration_seconds_count{` + labels + `}`:                        float64(greet),
		`qrpc_client_call_duration_seconds_bucket{` + labels + `,le="+Inf"}`:             float64(greet),
		`qrpc_client_inflight{server="` + server + `"}`:                                  0,
		`qrpc_client_connections{server="` + server + `",state="up"}`:                    2,
		`qrpc_client_call_duration_seconds_count{method="fail",server="` + server + `"}`: float64(fail),
		// summed over both workers too, at 0 (their readers started)
		`qrpc_client_panics_total{where="stream reader"}`: 0,
	}
	for k, v := range checks {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (listed: %v), want %v", k, g, ok, v)
		}
	}
	promtoolCheck(t, body)

	// Reload: new workers, no connections; counters stay, and the old
	// workers' gauges leave the dict when they exit (not when their 5 s
	// expiry passes).
	old := n.workerPIDs()
	n.signal("reload")
	for _, pid := range old {
		testwait.Until(t, fmt.Sprintf("old worker %d gone after a reload", pid), 20*time.Second, func() bool { return !pidAlive(pid) })
	}
	got, body = scrape(t, n)
	if v := got[`qrpc_client_connections{server="`+server+`",state="up"}`]; v != 0 {
		t.Fatalf("the exited workers' connections still count (%v):\n%s", v, body)
	}
	if got[okKey] != float64(greet) {
		t.Fatalf("after reload %s = %v, want %d", okKey, got[okKey], greet)
	}
}

// TestMetricsConfig: without metrics_dict, qrpc.metrics() is this
// worker's figures; the dict may be configured in init_by_lua; a dict that
// does not exist, or is full, is a clear error.
func TestMetricsConfig(t *testing.T) {
	srv := ownServer(t)
	runBlocks(t, []block{{
		name: "dict configured in init_by_lua",
		conf: ngxConf{Workers: 1, QServer: srv, HTTP: "    lua_shared_dict qrpc_metrics 1m;\n",
			InitByLua: fmt.Sprintf(`        assert(require("resty.ffi.qrpc").configure{ lib = %q, metrics_dict = "qrpc_metrics" })`, libPath),
			Server: loc("/t", connectT+`
                for _ = 1, 2 do assert(conn:unary("greet", "x")) end
                local text = qt.wait(5, function()
                    local text = assert(qrpc.metrics())
                    return text:find('qrpc_client_calls_total{method="greet",[^\n]*result="ok"} 2\n') and text
                end)
                local series = text and text:match('(qrpc_client_calls_total{method="greet",[^\n]*result="ok"}) %d+\n')
                -- from the dict, not this worker's own figures
                ngx.say(series, " ", ngx.shared.qrpc_metrics:get(series))`)},
		bodyRe: `^qrpc_client_calls_total\{method="greet",server="127\.0\.0\.1:\d+",result="ok"\} 2\n$`,
	}, {
		name: "one worker's figures",
		conf: ngxConf{Workers: 1, QServer: srv, Server: loc("/t", connectT+`
                for _ = 1, 3 do assert(conn:unary("greet", "x")) end
                local text = assert(qrpc.metrics())
                ngx.print(text:match('qrpc_client_calls_total{method="greet",[^\n]*result="ok"} %d+\n'))`)},
		bodyRe: `^qrpc_client_calls_total\{method="greet",server="127\.0\.0\.1:\d+",result="ok"\} 3\n$`,
	}, {
		name: "missing dict",
		conf: ngxConf{Workers: 1, AllowErrors: []string{`qrpc: metrics_dict: no lua_shared_dict named 'nope'`},
			Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local ok, err = qrpc.configure{ metrics_dict = "nope" }
                ngx.say(ok, " ", err)`)},
		body:   "nil bad argument #1: metrics_dict: no lua_shared_dict named 'nope'\n",
		logHas: []string{`\[error\].*qrpc: metrics_dict: no lua_shared_dict named 'nope'`},
	}, {
		name: "full dict",
		conf: ngxConf{Workers: 1, QServer: srv, HTTP: "    lua_shared_dict qrpc_metrics 12k;\n",
			InitWorkerByLua: `
        assert(require("resty.ffi.qrpc").configure{ metrics_dict = "qrpc_metrics" })`,
			AllowErrors: []string{`qrpc: metrics: lua_shared_dict 'qrpc_metrics' is full`},
			Server: loc("/t", connectT+`
                -- Many methods make many series: more than 12k holds.
                for i = 1, 200 do conn:unary("m" .. i, "x") end
                local text, err = qt.wait(5, function()
                    local text, err = qrpc.metrics()
                    if not text then return err end
                end)
                ngx.say(text)`)},
		bodyRe: `^qrpc: metrics: lua_shared_dict 'qrpc_metrics' is full \(.*\): its sums are incomplete; enlarge it\n$`,
		logHas: []string{`\[error\].*qrpc: metrics: lua_shared_dict 'qrpc_metrics' is full`},
	}})
}

// promtoolCheck runs `promtool check metrics`; outside CI a machine
// without promtool skips the check, in CI it must be there.
func promtoolCheck(t *testing.T, text string) {
	t.Helper()
	path, err := ngxtest.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (Debian package prometheus); CI must install it")
		}
		t.Log("promtool not found: not checked")
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestPrometheusScrapes: a real Prometheus server scrapes nginx's
// /metrics; its HTTP API returns the calls made.
func TestPrometheusScrapes(t *testing.T) {
	t.Parallel()
	bin, err := ngxtest.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("prometheus not found (Debian package prometheus); CI must install it")
		}
		t.Skip("prometheus not installed")
	}
	srv := ownServer(t)
	n := startNginx(t, metricsConf(ngxConf{QServer: srv}))
	calls := callsOf(spread(t, n, "greet", 25))

	dir := t.TempDir()
	port := ngxtest.FreePort(t)
	conf := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: qrpc\n    static_configs:\n      - targets: ['%s']\n", n.addr())
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logf.Close()
	}()

	q := url.QueryEscape(`sum(qrpc_client_calls_total{method="greet",result="ok"})`)
	api := fmt.Sprintf("http://127.0.0.1:%d/api/v1/query?query=%s", port, q)
	var last string
	// Prometheus scrapes every second: a bounded wait for its answer.
	if !testwait.For(60*time.Second, func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Fatalf("prometheus exited:\n%s", b)
		default:
		}
		v, raw, err := promQuery(api)
		if err == nil && v == float64(calls) {
			t.Logf("prometheus: %s", raw)
			return true
		}
		last = fmt.Sprintf("%v %s", err, raw)
		return false
	}) {
		b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
		t.Fatalf("after 60 s prometheus says %s, want %d calls\n%s", last, calls, b)
	}
}

// promQuery runs an instant query and returns the single value.
func promQuery(api string) (float64, string, error) {
	resp, err := http.Get(api)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string
		Data   struct {
			Result []struct {
				Value []any
			}
		}
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return 0, string(raw), err
	}
	if r.Status != "success" || len(r.Data.Result) != 1 || len(r.Data.Result[0].Value) != 2 {
		return 0, string(raw), fmt.Errorf("no single result")
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, string(raw), err
}
