package nginx

import (
	"fmt"
	"runtime"
	"testing"
)

// TestGOMAXPROCSWorkerEnv: the library reads GOMAXPROCS from the worker's
// environment as nginx's env directives make it, where Go's runtime
// reads the one nginx started with: `env GOMAXPROCS=2;` sets it, and a
// variable no env directive names is not the worker's.
func TestGOMAXPROCSWorkerEnv(t *testing.T) {
	def := 1
	if ng.Host() == "resty_ffi" {
		def = min(2, runtime.NumCPU())
	}
	code := `
                local qrpc = require "resty.ffi.qrpc"
                assert(qrpc.init_worker())
                ngx.say("worker env ", tostring(os.getenv("GOMAXPROCS")), " gomaxprocs ", qrpc.stats().gomaxprocs)`
	runBlocks(t, []block{{
		name: "env GOMAXPROCS=2; sets it",
		conf: ngxConf{Workers: 1, Main: "env GOMAXPROCS=2;", Server: loc("/t", code)},
		body: "worker env 2 gomaxprocs 2\n",
	}, {
		name: "env GOMAXPROCS=2; wins over the start-up environment's 3",
		conf: ngxConf{Workers: 1, Main: "env GOMAXPROCS=2;", ProcEnv: []string{"GOMAXPROCS=3"}, Server: loc("/t", code)},
		body: "worker env 2 gomaxprocs 2\n",
	}, {
		name: "no env directive: the start-up environment's 3 is not the worker's",
		conf: ngxConf{Workers: 1, ProcEnv: []string{"GOMAXPROCS=3"}, Server: loc("/t", code)},
		body: fmt.Sprintf("worker env nil gomaxprocs %d\n", def),
	}})
}
