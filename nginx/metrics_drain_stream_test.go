package nginx

// docs/metrics.md, "With metrics_dict": an exiting worker goes on adding
// to the dict while it drains its calls in flight, its gauges stay in the
// sum meanwhile, and the calls it finishes are counted.

import (
	"strings"
	"testing"
	"time"
)

// TestStreamCallsDrainedAfterReload: metrics.md tells a worker
// whose calls come from stream {} with the dict in http {} to call
// qrpc.init_worker() in http {}'s init_worker_by_lua, so that the http
// VM adds the worker's figures (both subsystems') to the dict. A stream
// call in flight across nginx -s reload must then be counted, and the
// old worker's inflight gauge stay in the sum while it drains: "An old
// worker that finishes its calls in flight after a reload ... goes on
// adding once a second while it does (its gauges stay in the sum
// meanwhile), and adds a last time when its last call has ended ...:
// the calls it finishes are counted too."
func TestStreamCallsDrainedAfterReload(t *testing.T) {
	requireStreamLua(t)
	srv := ownServer(t)
	n := startNginx(t, ngxConf{Workers: 1, QServer: srv, Stream: streamServers,
		HTTP: "    lua_shared_dict qrpc_metrics 4m;\n",
		InitWorkerByLua: `local qrpc = require("resty.ffi.qrpc")
            assert(qrpc.configure{ metrics_dict = "qrpc_metrics" })
            assert(qrpc.init_worker())`,
		Server:      lineLocation + metricsScrapeLoc,
		AllowErrors: []string{`qrpc: `}})
	// warm the stream VM (its connection dialled) and the http VM
	if got := streamAsk(t, n.streamPort, "unary echo warm"); got != "OK 0 warm" {
		t.Fatalf("stream warm-up: %q", got)
	}
	time.Sleep(1500 * time.Millisecond) // a flush
	m, _ := scrape(t, n)
	if v := metricSum(m, "qrpc_client_calls_total", `method="echo"`, `result="ok"`); v != 1 {
		t.Fatalf("before the reload: echo ok = %v, want 1 (the stream call, added by the http VM)", v)
	}
	done := make(chan string, 1)
	go func() {
		l, err := dialLines(n.streamPort, 5*time.Second)
		if err != nil {
			done <- err.Error()
			return
		}
		defer l.close()
		s, err := l.ask("slowecho 3000 drained", 30*time.Second)
		if err != nil {
			s = err.Error()
		}
		done <- s
	}()
	time.Sleep(1500 * time.Millisecond) // the slow call is in flight, a flush has passed
	m, _ = scrape(t, n)
	t.Logf("before the reload: inflight %v", metricSum(m, "qrpc_client_inflight"))
	n.signal("reload")
	time.Sleep(700 * time.Millisecond)
	m, _ = scrape(t, n)
	inflightDraining := metricSum(m, "qrpc_client_inflight")
	if inflightDraining != 1 {
		t.Errorf("qrpc_client_inflight = %v while the old worker drains its stream call, want 1", inflightDraining)
	}
	got := <-done
	if got != "OK 0 drained" {
		t.Fatalf("the stream call across the reload: %q", got)
	}
	time.Sleep(2500 * time.Millisecond)
	m, text := scrape(t, n)
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "qrpc_client_calls_total") && !strings.HasSuffix(l, " 0") {
			t.Log(l)
		}
	}
	if v := metricSum(m, "qrpc_client_calls_total", `method="slow"`, `result="ok"`); v != 1 {
		t.Errorf("qrpc_client_calls_total{method=\"slow\",result=\"ok\"} = %v after the old worker drained it, want 1", v)
	}
	if v := metricSum(m, "qrpc_client_calls_total", `method="echo"`, `result="ok"`); v != 2 {
		t.Errorf("qrpc_client_calls_total{method=\"echo\",result=\"ok\"} = %v, want 2 (warm-up, and the echo after the slow call)", v)
	}
}
