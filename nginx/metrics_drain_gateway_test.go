package nginx

// metrics_dict at worker exit: a gateway request that ends after the
// exiting worker's last flush adds its counts (docs/metrics.md).

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

// TestDrainingGatewayRequestCounted: a gateway request still running at a
// reload (here it sleeps 1.5 s first, as one whose body is still arriving
// would) makes its call after the old worker's last flush. The call's
// own series go into metrics_dict (after_exit_call), but gw:serve records
// the request (qrpc_gateway_requests_total, a source of the snapshot)
// only once unary has returned, after that flush: it is never added.
func TestDrainingGatewayRequestCounted(t *testing.T) {
	requireNginx(t)
	dir := gatewayDir(t)
	sd := compileShop(t, dir)
	shop := startShopServer(t, sd, "127.0.0.1:0")
	n := startNginx(t, ngxConf{
		Workers:         1,
		HTTP:            "    lua_shared_dict qrpc_metrics 4m;\n",
		InitByLua:       gatewayInit(dir),
		InitWorkerByLua: `assert(require("resty.ffi.qrpc").configure{ metrics_dict = "qrpc_metrics" })`,
		Extra: map[string]string{
			"shop_addr": shop.addr, "down_addr": shop.addr, "lost_addr": shop.addr,
			"pool_a": shop.addr, "pool_b": fmt.Sprintf("127.0.0.1:%d", ngxtest.FreePort(t)), "proto_dir": dir, "call_timeout": "10000",
		},
		Server: `
        location /api/ { content_by_lua_block {
            local w = tonumber(ngx.var.http_x_wait)
            if w then ngx.sleep(w) end
            package.loaded.gw_main:serve()
        } }` + metricsScrapeLoc,
		AllowErrors: []string{`qrpc: `, `qrpc gateway: routes\["GET /v1/x"\]: no method gwtest.Shop.Nope`, `bad proto: .*absent.proto`},
	})
	if r := n.req(t, "GET", "/api/v1/items/40", ""); r.status != 200 {
		t.Fatalf("GET item: %d %s", r.status, r.body)
	}
	done := make(chan string, 1)
	go func() {
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		req, _ := http.NewRequest("GET", n.url("/api/v1/items/41"), nil)
		req.Header.Set("X-Wait", "1.5")
		resp, err := client.Do(req)
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- fmt.Sprint(resp.StatusCode, " ", strings.TrimSpace(string(b)))
	}()
	time.Sleep(500 * time.Millisecond) // the request sleeps, no call in flight
	n.signal("reload")
	body := <-done
	t.Logf("the request across the reload: %s", body)
	if !strings.HasPrefix(body, "200 ") {
		t.Fatalf("the request across the reload: %q", body)
	}
	time.Sleep(3 * time.Second) // the old worker has exited, the new one flushed
	m, text := scrape(t, n)
	calls := metricSum(m, "qrpc_client_calls_total", `GetItem`, `result="ok"`)
	t.Logf("qrpc_client_calls_total GetItem ok = %v", calls)
	if v := metricSum(m, "qrpc_gateway_requests_total", `route="GET /api/v1/items/{id}"`, `status="200"`); v != 2 {
		t.Errorf("qrpc_gateway_requests_total{route=\"GET /api/v1/items/{id}\",status=\"200\"} = %v, want 2 (the second request's call is counted: %v calls ok)\n%s",
			v, calls, grepLines(text, "GetItem"))
	}
}
