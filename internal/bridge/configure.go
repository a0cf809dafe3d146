package bridge

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
)

// Runtime settings (QRPC_OP_CONFIGURE) and the worker's GOMAXPROCS.
//
// Each nginx worker runs its own Go runtime, and Go sizes it to the
// machine: with `worker_processes auto` on N CPUs that is N runtimes of N
// Ps each, and a GC cycle in one worker may then run idle-priority mark
// workers on all N Ps, taking CPUs from the other workers. Measured on 2
// vCPUs (make bench, GOMAXPROCS section): 1 P is the cheapest per request
// (0.64x the CPU, 1.30x the req/s of 2 Ps) but doubles a sequential call's
// time (464 vs 248 us), because the goroutine that sends a call's packet
// waits until sysmon takes the only P back from the nginx thread. 2 Ps
// keep that latency; more add threads and GC contention but no hand-off
// the worker needs. Hence the default: min(2, Go's own), unless the
// GOMAXPROCS environment variable is set.

// maxGOMAXPROCS bounds configure{ gomaxprocs }.
const maxGOMAXPROCS = 1024

// defaultProcsCap is the library's default GOMAXPROCS ceiling.
const defaultProcsCap = 2

func init() {
	RegisterQuery(OpConfigure, func(r *Runtime, cmd *Command) ([]byte, error) {
		return Configure(cmd.Opts)
	})
}

// DefaultGOMAXPROCS applies the library's default when the environment
// does not set GOMAXPROCS; it returns the value in force and whether it
// may adapt to the load (StartAutoGOMAXPROCS: the library's default, with
// more than one P). The host calls it once, when the library loads in a
// worker.
func DefaultGOMAXPROCS() (n int, adapt bool) {
	if os.Getenv("GOMAXPROCS") != "" {
		return runtime.GOMAXPROCS(0), false
	}
	if n := runtime.GOMAXPROCS(0); n > defaultProcsCap {
		runtime.GOMAXPROCS(defaultProcsCap)
	}
	n = runtime.GOMAXPROCS(0)
	return n, n > 1
}

// Configure applies "key=value" lines (empty: none) and answers with the
// settings in force, "gomaxprocs=N\n". Keys: gomaxprocs (1..1024).
func Configure(opts []byte) ([]byte, error) {
	procs := 0
	for len(opts) > 0 {
		var line []byte
		line, opts, _ = bytes.Cut(opts, []byte("\n"))
		if len(line) == 0 {
			continue
		}
		k, v, ok := bytes.Cut(line, []byte("="))
		if !ok {
			return nil, Badf("opts: line %q is not key=value", line)
		}
		switch string(k) {
		case "gomaxprocs":
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 1 || n > maxGOMAXPROCS {
				return nil, Badf("opts: gomaxprocs must be an integer 1..%d, got %q", maxGOMAXPROCS, v)
			}
			procs = n
		default:
			return nil, Badf("opts: unknown key %q", k)
		}
	}
	if procs > 0 {
		procsFixed.Store(true) // the user's choice: no more adapting
		runtime.GOMAXPROCS(procs)
	}
	return []byte("gomaxprocs=" + strconv.Itoa(runtime.GOMAXPROCS(0)) + "\n"), nil
}
