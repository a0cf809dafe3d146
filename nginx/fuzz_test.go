package nginx

import (
	"fmt"
	"strings"
	"testing"
)

// TestFuzzPublicFunctions: every public function of resty.ffi.qrpc
// (qrpc.connect, conn:unary, conn:event, conn:close, conn:stats,
// conn:peers, qrpc.configure, qrpc.stats, qrpc.metrics) called 10,000
// times inside nginx with random arguments (testdata/qfuzz.lua: random
// scalars, NaN and infinities, 70 KB strings, cycles, tables whose
// __index/__tostring/__len/__pairs raise, closed and foreign connection
// objects) from a seeded PRNG. Nothing throws, every failure is nil and a
// string of the documented vocabulary (never "bad command:", never
// nil, nil, with an info table from connect, unary and event), and the
// worker keeps its connection, which answers afterwards.
func TestFuzzPublicFunctions(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, AllowErrors: []string{`metrics_dict: no lua_shared_dict named`}, Server: loc("/t", `
                local rep = require("qfuzz").run(tonumber(ngx.var.arg_n), tonumber(ngx.var.arg_seed), 10000)
                ngx.print(rep)`)})
	// ten requests of 1,000 rounds: one of 2,500 took 20 s here and over
	// the harness client's 30 s on a loaded CI machine
	var st int
	var body string
	for i := 0; i < 10; i++ {
		st, body = n.get(fmt.Sprintf("/t?n=1000&seed=%d&timing=1", 42+i))
		if st != 200 || !strings.Contains(body, "failures 0\n") {
			t.Fatalf("%d\n%s", st, strings.TrimSpace(body))
		}
	}
	want := "conn:close=n conn:event=n conn:peers=n conn:stats=n conn:unary=n qrpc.configure=n qrpc.connect=n qrpc.metrics=n qrpc.stats=n\n" +
		"failures 0\nafter: after pools kept true\n"
	if st != 200 || !strings.HasSuffix(body, want) {
		t.Fatalf("%d\n%s\nwant\n%s", st, strings.TrimSpace(body), want)
	}
	if testing.Verbose() {
		t.Log(body)
	}
}
