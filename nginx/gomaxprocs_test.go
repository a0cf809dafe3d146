package nginx

import (
	"fmt"
	"runtime"
	"testing"
)

// TestGOMAXPROCS: the worker's Go runtime gets the library's default
// (1 P with the built-in host, at most 2 with lua-resty-ffi) unless the
// environment sets GOMAXPROCS, and configure{ gomaxprocs } changes it
// before or after the library loads. (The cap itself, visible only above
// 2 CPUs, is bridge's TestDefaultGOMAXPROCS.)
func TestGOMAXPROCS(t *testing.T) {
	def := 1
	if ng.Host() == "resty_ffi" {
		def = min(2, runtime.NumCPU())
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
		name: "the environment's GOMAXPROCS is kept",
		conf: ngxConf{Workers: 1, EnvNames: []string{"GOMAXPROCS"}, ProcEnv: []string{"GOMAXPROCS=3"},
			Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                assert(qrpc.init_worker())
                ngx.say(qrpc.stats().gomaxprocs)`)},
		body: "3\n",
	}})
}

// TestSysmonSetting: GODEBUG=schedtrace=N (N > 0) in nginx's environment
// keeps Go's sysmon from its deep sleep (docs/tuning.md), and
// qrpc.stats().sysmon says which mode the worker's runtime runs in. Go
// reads the environment the process started with, so the variable works
// with or without an env directive.
func TestSysmonSetting(t *testing.T) {
	code := `
                local qrpc = require "resty.ffi.qrpc"
                assert(qrpc.init_worker())
                ngx.say(qrpc.stats().sysmon)`
	runBlocks(t, []block{{
		name: "default",
		conf: ngxConf{Workers: 1, Server: loc("/t", code)},
		body: "go\n",
	}, {
		name: "schedtrace in the environment",
		conf: ngxConf{Workers: 1, EnvNames: []string{"GODEBUG"}, ProcEnv: []string{"GODEBUG=madvdontneed=1,schedtrace=2147483647"},
			Server: loc("/t", code)},
		body: "lazy\n",
	}, {
		name: "without an env directive",
		conf: ngxConf{Workers: 1, ProcEnv: []string{"GODEBUG=schedtrace=2147483647"}, Server: loc("/t", code)},
		body: "lazy\n",
	}, {
		name: "schedtrace=0",
		conf: ngxConf{Workers: 1, EnvNames: []string{"GODEBUG"}, ProcEnv: []string{"GODEBUG=schedtrace=2147483647,schedtrace=0"},
			Server: loc("/t", code)},
		body: "go\n",
	}})
}
