package nginx

import (
	"fmt"
	"runtime"
	"testing"
)

// TestGOMAXPROCS: the worker's Go runtime gets the library's default
// (at most 2 Ps, 1 while many calls are in flight) unless the environment
// sets GOMAXPROCS, and configure{ gomaxprocs } changes it before or after
// the library loads.
// (The cap itself, visible only above 2 CPUs, is bridge's
// TestDefaultGOMAXPROCS.)
func TestGOMAXPROCS(t *testing.T) {
	def := min(2, runtime.NumCPU())
	if def < 2 {
		t.Skip("one CPU: the default is 1 P and nothing adapts")
	}
	runBlocks(t, []block{{
		name: "default, then configured after the load",
		conf: ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                ngx.say("before the load: ", tostring(qrpc.stats().gomaxprocs))
                assert(qrpc.init_worker())
                ngx.say("default: ", qrpc.stats().gomaxprocs)
                ngx.say(tostring(qrpc.configure{ gomaxprocs = 1 }), " ", qrpc.stats().gomaxprocs)
                for _, v in ipairs({ 0, 1.5, 1025, "2" }) do
                    local ok, err = qrpc.configure{ gomaxprocs = v }
                    ngx.say(tostring(ok), " ", err)
                end
                ngx.say("still: ", qrpc.stats().gomaxprocs)`)},
		body: fmt.Sprintf("before the load: nil\ndefault: %d\ntrue 1\n", def) +
			"nil bad argument #1: gomaxprocs must be an integer 1..1024\n" +
			"nil bad argument #1: gomaxprocs must be an integer 1..1024\n" +
			"nil bad argument #1: gomaxprocs must be an integer 1..1024\n" +
			"nil bad argument #1: gomaxprocs must be an integer 1..1024\n" +
			"still: 1\n",
	}, {
		name: "configured before the load",
		conf: ngxConf{Workers: 1,
			InitWorkerByLua: `assert(require("resty.ffi.qrpc").configure{ gomaxprocs = 1 })`,
			Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                assert(qrpc.init_worker())
                ngx.say(qrpc.stats().gomaxprocs)`)},
		body: "1\n",
	}, {
		// The library's default adapts: 1 P while many calls are in
		// flight, the default back when the load is gone.
		name: "adapting to the load",
		conf: ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local stop = false
                local threads = {}
                for i = 1, 40 do
                    threads[i] = ngx.thread.spawn(function()
                        local n, bad = 0, 0
                        while not stop and n < 100000 do
                            local res = conn:unary("echo", "x")
                            if not res then bad = bad + 1 end
                            n = n + 1
                        end
                        return bad
                    end)
                end
                local under = qrpc.stats().gomaxprocs
                for _ = 1, 100 do  -- at most 10 s
                    under = qrpc.stats().gomaxprocs
                    if under == 1 then break end
                    ngx.sleep(0.1)
                end
                stop = true
                local bad = 0
                for i = 1, 40 do
                    local _, b = ngx.thread.wait(threads[i])
                    bad = bad + b
                end
                local after = 0
                for _ = 1, 100 do
                    after = qrpc.stats().gomaxprocs
                    if after ~= 1 then break end
                    ngx.sleep(0.1)
                end
                ngx.say("under load: ", under, ", after: ", after, ", failed calls: ", bad)`)},
		body: fmt.Sprintf("under load: 1, after: %d, failed calls: 0\n", def),
	}, {
		name: "the environment's GOMAXPROCS is kept",
		conf: ngxConf{Workers: 1, EnvNames: []string{"GOMAXPROCS"}, ProcEnv: []string{"GOMAXPROCS=3"},
			Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                assert(qrpc.init_worker())
                ngx.say(qrpc.stats().gomaxprocs)`)},
		body: "3\n",
	}})
}
