package nginx

// metrics_dict at worker exit: a call that ends after the exiting
// worker's last flush adds its counts (docs/metrics.md).

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestDrainingRequestExpiredCallCounted: TestDrainingRequestSecondCallCounted
// with a second call whose deadline had passed (not sent: a timeout
// counted in qrpc_client_deadline_expired_total, a Lua-side series). It
// ends after the exit's last flush, like the second call there, and must
// be added to the dict too: unary returns on that path before
// after_exit_call.
func TestDrainingRequestExpiredCallCounted(t *testing.T) {
	requireNginx(t)
	srv := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, QServer: srv,
		HTTP:            "    lua_shared_dict qrpc_metrics 4m;\n",
		InitWorkerByLua: `assert(require("resty.ffi.qrpc").configure{ metrics_dict = "qrpc_metrics" })`,
		Server: loc("/two", connectT+`
                local r1, e1 = conn:unary("slow", "1500", { timeout = 10000 })
                ngx.sleep(2)
                local r2, e2 = conn:unary("greet", "second", { deadline = ngx.now() - 1 })
                ngx.say(r1 and r1.body or tostring(e1), " / ", r2 and r2.body or tostring(e2))`) + metricsScrapeLoc,
		AllowErrors: []string{`qrpc: `}})
	if st, b := n.get("/metrics"); st != 200 {
		t.Fatalf("/metrics: %d %s", st, b)
	}
	done := make(chan string, 1)
	go func() {
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Get(n.url("/two"))
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- strings.TrimSpace(string(b))
	}()
	time.Sleep(700 * time.Millisecond) // the slow call is in flight
	n.signal("reload")
	body := <-done
	t.Logf("the request across the reload: %s", body)
	if body != "slept 1500 / timeout" {
		t.Fatalf("the request across the reload: %q", body)
	}
	time.Sleep(3 * time.Second) // the old worker has exited, the new one flushed
	m, _ := scrape(t, n)
	if v := metricSum(m, "qrpc_client_calls_total", `method="slow"`, `result="ok"`); v != 1 {
		t.Errorf("slow ok = %v, want 1", v)
	}
	if v := metricSum(m, "qrpc_client_deadline_expired_total", `method="greet"`); v != 1 {
		t.Errorf("qrpc_client_deadline_expired_total{method=\"greet\"} = %v: the old worker's draining request made a call past its deadline after the exit's last flush, want 1", v)
	}
}
