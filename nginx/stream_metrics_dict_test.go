package nginx

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMetricsDictStreamCalls: metrics.md's recipe for calls made in
// stream {} and summed in an http {} dict. Each worker adds its figures
// from the Lua VM of the dict's subsystem once that VM has loaded the
// library; qrpc.init_worker() in http's init_worker_by_lua loads it in
// every worker, so /metrics counts the calls of both workers' stream VMs.
func TestMetricsDictStreamCalls(t *testing.T) {
	requireStreamLua(t)
	c := ngxConf{Workers: 2, QServer: ownServer(t), HTTP: "lua_shared_dict qrpc_m 4m;\n"}
	c.InitByLua = `
        local qt = require "qtest"
        assert(require("resty.ffi.qrpc").configure{ host = qt.host, lib = qt.lib, socket_dir = qt.dir .. "/run", metrics_dict = "qrpc_m" })`
	c.InitWorkerByLua = `assert(require("resty.ffi.qrpc").init_worker())`
	c.Server = loc("/metrics", `ngx.print(assert(require("resty.ffi.qrpc").metrics()))`)
	c.Stream = `
    init_worker_by_lua_block {
        ngx.timer.at(0, function()
            local qt = require "qtest"
            local conn = assert(qt.connect())
            for i = 1, 10 do assert(conn:unary("echo", "s" .. i)) end
        end)
    }
    server {
        listen 127.0.0.1:{{.StreamPort}};
        content_by_lua_block { ngx.say("up") }
    }
`
	n := startNginx(t, c)
	err := eventually(10*time.Second, func() error {
		_, text := n.get("/metrics")
		got := 0
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "qrpc_client_calls_total{") && strings.Contains(l, `method="echo"`) && strings.Contains(l, `result="ok"`) {
				v, _ := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
				got += int(v)
			}
		}
		if got != 20 {
			return fmt.Errorf("/metrics counts %d echo calls ok, want 20 (10 from each worker's stream VM)", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
