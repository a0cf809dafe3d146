package bridge

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
)

// QRPC_OP_CONFIGURE: runtime settings of this worker, as opts lines
// ("key=value\n"):
//
//	gomaxprocs=N     the Ps of the worker's Go runtime (1..1024) (see
//	                 DefaultGOMAXPROCS).
//	metrics=on|off   record calls in the worker's metrics (on). Off, the
//	                 pools dialled afterwards get qrpc.NopObserver, so
//	                 their calls cost nothing to record and show nowhere
//	                 in the metrics; pools dialled before keep recording.
//
// Unknown keys and values are errors, and then nothing is applied. The
// answer is the settings in force after the command, in the same form
// ("gomaxprocs=N\nmetrics=on\n").

// maxGOMAXPROCS bounds configure{ gomaxprocs }.
const maxGOMAXPROCS = 1024

// defaultProcsCap is the library's default GOMAXPROCS ceiling.
//
// Each nginx worker runs its own Go runtime, and Go sizes it to the
// machine: with `worker_processes auto` on N CPUs that is N runtimes of N
// Ps each, and a GC cycle in one worker may then run idle-priority mark
// workers on all N Ps, taking CPUs from the other workers. 2 Ps keep a
// lone call's latency (an idle P runs the goroutine that sends its packet
// while the nginx thread holds the other); more add threads and GC
// contention but no hand-off the worker needs. Under load 1 P is cheaper
// (0.64x the CPU per request, 1.30x the requests/s under wrk in one full
// bench) but a lone sequential call takes 1.9x as long, because the
// goroutine that sends its packet waits until sysmon takes the only P back
// from the nginx thread: users who want that trade set gomaxprocs = 1.
const defaultProcsCap = 2

func init() {
	RegisterQuery(OpConfigure, func(r *Runtime, cmd *Command) ([]byte, error) {
		if err := r.Configure(cmd.Opts); err != nil {
			return nil, err
		}
		return r.settings(), nil
	})
}

// DefaultGOMAXPROCS applies the library's default when the environment
// does not set GOMAXPROCS; it returns the value in force. The host calls
// it once, when the library loads in a worker.
func DefaultGOMAXPROCS() int {
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) > defaultProcsCap {
		runtime.GOMAXPROCS(defaultProcsCap)
	}
	return runtime.GOMAXPROCS(0)
}

// Configure applies CONFIGURE's opts lines (see above).
func (r *Runtime) Configure(opts []byte) error {
	if len(opts) > maxOptsLen {
		return Badf("opts: %d bytes, at most %d", len(opts), maxOptsLen)
	}
	var off *bool
	procs := 0
	for _, line := range bytes.Split(opts, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		k, v, ok := bytes.Cut(line, []byte("="))
		if !ok {
			return Badf("opts: %q is not key=value", clipOpt(string(line)))
		}
		switch key, val := string(k), string(v); key {
		case "gomaxprocs":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > maxGOMAXPROCS {
				return Badf("opts: gomaxprocs must be an integer 1..%d, got %q", maxGOMAXPROCS, clipOpt(val))
			}
			procs = n
		case "metrics":
			var b bool
			switch val {
			case "on":
			case "off":
				b = true
			default:
				return Badf("opts: metrics must be on or off, got %q", clipOpt(val))
			}
			off = &b
		default:
			return Badf("opts: unknown key %q", clipOpt(key))
		}
	}
	if off != nil {
		r.metricsOff.Store(*off)
	}
	if procs > 0 {
		runtime.GOMAXPROCS(procs)
	}
	return nil
}

// settings is the answer of CONFIGURE: what is in force now.
func (r *Runtime) settings() []byte {
	state := "on"
	if r.metricsOff.Load() {
		state = "off"
	}
	return fmt.Appendf(nil, "gomaxprocs=%d\nmetrics=%s\n", runtime.GOMAXPROCS(0), state)
}
