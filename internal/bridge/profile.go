package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// QRPC_OP_PROFILE: a pprof profile of this worker's Go runtime (where the
// Go work of a request goes, seen from inside the worker), as opts
// records:
//
//	PROFILE_KIND heap|allocs|goroutine|threadcreate  answers that profile now
//	PROFILE_KIND cpu, PROFILE_SECONDS N              starts the CPU profile
//	                                                 and answers nothing
//	PROFILE_KIND cpu-stop                            stops it and answers it
//
// Profiles are gzipped protobuf, for `go tool pprof`. Lua's
// qrpc.debug_profile starts the CPU profile, sleeps, and stops it; if
// nobody stops it (the light thread was killed), it stops by itself
// cpuProfileGrace after its N seconds and is dropped, so that Go's
// profiling signal does not run in the worker for ever.

// MaxProfileSeconds bounds a CPU profile's seconds.
const MaxProfileSeconds = limits.ProfileSeconds

// cpuProfileGrace is how long past its seconds an unstopped CPU profile
// runs before it stops by itself.
const cpuProfileGrace = 5 * time.Second

// profiles the query answers at once (runtime/pprof's names); block and
// mutex are left out: they record nothing unless their rates are set.
var instantProfiles = map[string]bool{"heap": true, "allocs": true, "goroutine": true, "threadcreate": true}

// cpuProfile is the CPU profile in progress, if any: one per process, as
// runtime/pprof allows.
type cpuProfile struct {
	mu    sync.Mutex
	buf   *bytes.Buffer // nil: none running
	timer *time.Timer   // stops an abandoned profile; owned here, stopped by stop
	seq   uint64        // numbers the profiles, so a late timer stops only its own
}

var cpuProf cpuProfile

func init() {
	RegisterQuery(OpProfile, func(_ *Runtime, cmd *Command) ([]byte, error) {
		return profile(cmd.Opts)
	})
}

// profile runs one PROFILE query (see above).
func profile(opts []byte) ([]byte, error) {
	var kind string
	secs := -1
	err := eachRec(opts, func(r Rec) error {
		switch r.Key {
		case KeyProfileKind:
			if kind != "" {
				return Badf("opts: kind given twice")
			}
			kind = r.Str()
		case KeyProfileSeconds:
			n, err := optInt("seconds", r, 1, MaxProfileSeconds)
			if err != nil {
				return err
			}
			secs = n
		default:
			return Badf("opts: record %d is not a PROFILE option", r.Key)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch {
	case kind == "cpu":
		if secs < 0 {
			return nil, Badf("opts: kind=cpu needs seconds")
		}
		return nil, cpuProf.start(time.Duration(secs) * time.Second)
	case secs >= 0:
		return nil, Badf("opts: seconds is only for kind=cpu")
	case kind == "cpu-stop":
		return cpuProf.stop()
	case instantProfiles[kind]:
		var b bytes.Buffer
		if err := pprof.Lookup(kind).WriteTo(&b, 0); err != nil {
			return nil, fmt.Errorf("profile %s: %w", kind, err)
		}
		return b.Bytes(), nil
	case kind == "":
		return nil, Badf("opts: no kind")
	}
	return nil, Badf("opts: unknown profile kind %q (cpu, heap, allocs, goroutine, threadcreate)", clipOpt(kind))
}

// errCPUProfileRunning and errNoCPUProfile are the state errors of the CPU
// profile; Lua shows their text after "qrpc: ".
var (
	errCPUProfileRunning = errors.New("profile: a CPU profile is already running in this worker")
	errNoCPUProfile      = errors.New("profile: no CPU profile is running in this worker")
)

func (p *cpuProfile) start(d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.buf != nil {
		return errCPUProfileRunning
	}
	buf := new(bytes.Buffer)
	if err := pprof.StartCPUProfile(buf); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	p.seq++
	seq := p.seq
	p.buf = buf
	p.timer = safego.AfterFunc("profile timer", d+cpuProfileGrace, func() { p.abandon(seq) }, nil)
	return nil
}

// stop ends the profile and returns it. It waits for runtime/pprof to
// write the last samples (milliseconds).
func (p *cpuProfile) stop() ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.buf == nil {
		return nil, errNoCPUProfile
	}
	p.timer.Stop()
	pprof.StopCPUProfile()
	b := p.buf.Bytes()
	p.buf, p.timer = nil, nil
	return b, nil
}

// abandon stops profile seq if it still runs, and drops it.
func (p *cpuProfile) abandon(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.buf == nil || p.seq != seq {
		return
	}
	pprof.StopCPUProfile()
	p.buf, p.timer = nil, nil
}
