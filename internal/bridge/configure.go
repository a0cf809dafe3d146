package bridge

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
)

// QRPC_OP_CONFIGURE: runtime settings of this worker, as an opts record
// block:
//
//	GOMAXPROCS N     the Ps of the worker's Go runtime (1..1024) (see
//	                 DefaultGOMAXPROCS).
//	METRICS 1|0      record calls in the worker's metrics (1). Off, the
//	                 pools dialled afterwards get a no-op observer, so
//	                 their calls cost nothing to record and show nowhere
//	                 in the metrics; pools dialled before keep recording.
//
// Unknown keys and values are errors, and then nothing is applied. The
// answer is the settings in force after the command, in the same form
// (GOMAXPROCS, METRICS, and SYSMON: see SysmonMode).

// maxGOMAXPROCS bounds configure{ gomaxprocs }.
const maxGOMAXPROCS = limits.GOMAXPROCS

// The library's default GOMAXPROCS depends on the host.
//
// Each nginx worker runs its own Go runtime, and Go sizes it to the
// machine: with `worker_processes auto` on N CPUs that is N runtimes of N
// Ps each, and a GC cycle in one worker may then run idle-priority mark
// workers on all N Ps, taking CPUs from the other workers.
//
// Built-in host: 1 P. Its nginx thread never enters Go on the hot path
// (the C queues of internal/hostq/hostq.c), so the one P is never held by the nginx
// thread, and one P batches the worker's Go work on one thread instead of
// waking a second one for every hand-off. Measured under wrk (2 vCPUs,
// unpinned, 100 B echo, interleaved with 2 Ps on the same build): 0.84x
// the worker CPU per request, 1.17x the requests/s, and a lone sequential
// call 0.84x as long. One P relies on the nginx thread staying out of Go:
// a thread that enters Go keeps the only P while it runs nginx, and the
// goroutine that sends a call's packet waits until sysmon takes it back
// (1.9x a lone call's time).
//
// lua-resty-ffi host: at most 2 Ps.
// Its poller goroutine blocks in a C call (ngx_http_lua_ffi_task_poll)
// holding a P until sysmon takes it back; a second P runs the rest
// meanwhile.
const (
	builtinProcs    = 1
	restyFFIProcCap = 2
)

var (
	// procsChosen: the environment's GOMAXPROCS or configure{ gomaxprocs }
	// decided; the host defaults leave the setting alone then.
	procsChosen atomic.Bool
	// goProcs is Go's own default, seen when the library loaded.
	goProcs atomic.Int32
)

// DefaultGOMAXPROCS applies GOMAXPROCS from the worker's environment,
// else the built-in host's default; it returns the value in force. The
// library calls it once, when it loads in a worker, before any goroutine
// starts. env is the worker's environment: in nginx that is libc's, as
// nginx's env directives made it (`env GOMAXPROCS=2;` sets it, and a
// variable no directive names is gone), not the one the process started
// with, which is the only one Go's runtime reads (os.Getenv).
func DefaultGOMAXPROCS(env func(string) (string, bool)) int {
	n := runtime.GOMAXPROCS(0)
	if envProcs(os.Getenv("GOMAXPROCS")) {
		// Go took the start-up environment's value: its own default is
		// the CPUs it sees.
		n = runtime.NumCPU()
	}
	goProcs.Store(int32(n))
	if v, ok := env("GOMAXPROCS"); ok && envProcs(v) {
		procsChosen.Store(true)
		p, _ := strconv.Atoi(v)
		runtime.GOMAXPROCS(min(p, maxGOMAXPROCS))
		return runtime.GOMAXPROCS(0)
	}
	// Set even when Go's default is already 1 (a worker pinned to one
	// CPU): only a call to runtime.GOMAXPROCS stops Go from re-sizing the
	// runtime to the CPUs it sees, once a second while sysmon runs (Go
	// 1.25's updatemaxprocs), so a widened affinity or cgroup would
	// otherwise give the worker a second P.
	runtime.GOMAXPROCS(min(n, builtinProcs))
	return runtime.GOMAXPROCS(0)
}

// envProcs tells a GOMAXPROCS value that Go's runtime would take (its own
// test, schedinit in Go 1.26): Go ignores any other, "0" and "abc"
// alike, and the library's default applies then.
func envProcs(v string) bool {
	n, err := strconv.ParseInt(v, 10, 32)
	return err == nil && n > 0
}

// RestyFFIGOMAXPROCS applies the lua-resty-ffi host's default, min(2, Go's
// default), unless the environment or configure{ gomaxprocs } chose; it
// returns the value in force. libffi_init calls it.
func RestyFFIGOMAXPROCS() int {
	if !procsChosen.Load() {
		if n := min(restyFFIProcCap, int(goProcs.Load())); n > runtime.GOMAXPROCS(0) {
			runtime.GOMAXPROCS(n)
		}
	}
	return runtime.GOMAXPROCS(0)
}

func init() {
	RegisterQuery(OpConfigure, func(r *Runtime, cmd *Command) ([]byte, error) {
		if err := r.Configure(cmd.Opts); err != nil {
			return nil, err
		}
		return r.settings(), nil
	})
}

// Configure applies CONFIGURE's opts block: GOMAXPROCS (1..the
// bound), METRICS (1: record the pools dialled from now on, 0: not).
func (r *Runtime) Configure(opts []byte) error {
	var off *bool
	procs := 0
	err := eachRec(opts, func(rec Rec) error {
		switch rec.Key {
		case KeyGomaxprocs:
			n, err := optInt("gomaxprocs", rec, 1, maxGOMAXPROCS)
			if err != nil {
				return err
			}
			procs = n
		case KeyMetrics:
			v := rec.Int()
			if v != 0 && v != 1 {
				return Badf("opts: metrics must be 0 or 1, got %d", v)
			}
			b := v == 0
			off = &b
		default:
			return Badf("opts: record %d is not a CONFIGURE option", rec.Key)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if off != nil {
		r.metricsOff.Store(*off)
	}
	if procs > 0 {
		procsChosen.Store(true)
		runtime.GOMAXPROCS(procs)
	}
	return nil
}

// settings is the answer of CONFIGURE, what is in force now: GOMAXPROCS,
// METRICS and SYSMON records.
func (r *Runtime) settings() []byte {
	var on int64 = 1
	if r.metricsOff.Load() {
		on = 0
	}
	b := AppendInt(nil, KeyGomaxprocs, int64(runtime.GOMAXPROCS(0)))
	b = AppendInt(b, KeyMetrics, on)
	return AppendStr(b, KeySysmon, SysmonMode())
}

// SysmonMode is how the runtime's sysmon thread runs: "lazy" when GODEBUG
// set schedtrace when the runtime started (the Lua loader does so for the
// built-in host: see its set_godebug), so that sysmon never enters the
// deep sleep that each system call or cgo call would end with 20 us
// polling; "go" otherwise. Go's copy of the environment is the one taken
// at start-up, which is what the runtime parsed.
func SysmonMode() string {
	mode := "go"
	for _, f := range strings.Split(os.Getenv("GODEBUG"), ",") {
		if v, ok := strings.CutPrefix(f, "schedtrace="); ok {
			mode = "go"
			if n, err := strconv.ParseInt(v, 10, 32); err == nil && n > 0 {
				mode = "lazy"
			}
		}
	}
	return mode
}
