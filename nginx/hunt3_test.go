package nginx

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
)

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
