package bridge

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gunzipped checks that b is a gzipped pprof protobuf and returns it
// unzipped: a profile is a gzip stream whose content names its sample
// types (strings in the protobuf's string table).
func gunzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v (%d bytes)", err, len(b))
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gzip: %v", err)
	}
	return raw
}

func TestProfileInstant(t *testing.T) {
	for kind, want := range map[string]string{"heap": "inuse_space", "allocs": "alloc_space", "goroutine": "goroutine", "threadcreate": "threadcreate"} {
		b, err := profile(recs("kind=" + kind + "\n"))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if raw := gunzipped(t, b); !bytes.Contains(raw, []byte(want)) {
			t.Fatalf("%s profile does not name %q", kind, want)
		}
	}
	// a goroutine profile names this test's function
	b, _ := profile(recs("kind=goroutine"))
	if !bytes.Contains(gunzipped(t, b), []byte("TestProfileInstant")) {
		t.Fatal("goroutine profile without this test's frame")
	}
}

func TestProfileCPU(t *testing.T) {
	if _, err := profile(recs("kind=cpu-stop")); !errors.Is(err, errNoCPUProfile) {
		t.Fatalf("stop with none running: %v", err)
	}
	// 30 s: the profile stops by itself 35 s after it starts, well after
	// the burn below ends, even on a loaded machine.
	if _, err := profile(recs("kind=cpu\nseconds=30\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := profile(recs("kind=cpu\nseconds=1\n")); !errors.Is(err, errCPUProfileRunning) {
		t.Fatalf("second start: %v", err)
	}
	// Burn 300 ms of this thread's CPU in a function the profile must
	// name: counted in CPU time, not wall time, because under the parallel
	// -race run 300 ms of wall time can get too few samples. Bounded by
	// 10 s of wall time.
	runtime.LockOSThread()
	start := threadCPU(t)
	deadline := time.Now().Add(10 * time.Second)
	for threadCPU(t)-start < 300*time.Millisecond && time.Now().Before(deadline) {
		burnProfiled()
	}
	runtime.UnlockOSThread()
	b, err := profile(recs("kind=cpu-stop"))
	if err != nil {
		t.Fatal(err)
	}
	raw := gunzipped(t, b)
	if !bytes.Contains(raw, []byte("cpu")) || !bytes.Contains(raw, []byte("burnProfiled")) {
		t.Fatalf("CPU profile (%d bytes) without the burning function", len(raw))
	}
	if _, err := profile(recs("kind=cpu-stop")); !errors.Is(err, errNoCPUProfile) {
		t.Fatalf("second stop: %v", err)
	}
}

// threadCPU is the calling thread's CPU time (the caller locks its thread).
func threadCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1, &ru); err != nil { // RUSAGE_THREAD
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var burnSink uint64

//go:noinline
func burnProfiled() {
	for i := uint64(0); i < 1e5; i++ {
		burnSink += i * i
	}
}

// A CPU profile nobody stops (its light thread was killed) stops by
// itself; the next one can start.
func TestProfileCPUAbandoned(t *testing.T) {
	if err := cpuProf.start(10 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// the timer fires 10 ms + cpuProfileGrace later; run it now
	cpuProf.mu.Lock()
	seq := cpuProf.seq
	cpuProf.mu.Unlock()
	cpuProf.abandon(seq - 1) // an older profile's late timer: no effect
	if _, err := profile(recs("kind=cpu\nseconds=1")); !errors.Is(err, errCPUProfileRunning) {
		t.Fatalf("after an older timer: %v, want still running", err)
	}
	cpuProf.abandon(seq)
	if _, err := profile(recs("kind=cpu-stop")); !errors.Is(err, errNoCPUProfile) {
		t.Fatalf("after its timer: %v, want none running", err)
	}
	if _, err := profile(recs("kind=cpu\nseconds=1")); err != nil {
		t.Fatalf("start after an abandoned one: %v", err)
	}
	if _, err := profile(recs("kind=cpu-stop")); err != nil {
		t.Fatal(err)
	}
}

func TestProfileBadOpts(t *testing.T) {
	for opts, want := range map[string]string{
		"":                                   "no kind",
		"kind=block":                         "unknown profile kind",
		"kind=cpu":                           "needs seconds",
		"kind=cpu\nseconds=0":                "seconds must be an integer 1..300",
		"kind=cpu\nseconds=301":              "seconds must be an integer 1..300",
		"kind=cpu\nseconds=x":                "record 26: a number of 1 bytes",
		"kind=heap\nseconds=1":               "only for kind=cpu",
		"kind=heap\nkind=cpu":                "kind given twice",
		"kind=heap\ngc=1":                    "unknown record key",
		"kind=" + strings.Repeat("x", 70000): "bytes, at most",
	} {
		_, err := profile(recs(opts))
		if !errors.Is(err, ErrBadCommand) || !strings.Contains(err.Error(), want) {
			t.Errorf("%.30q: %v, want a bad command with %q", opts, err, want)
		}
	}
	if _, err := profile(recs("kind=cpu-stop\nseconds=1")); err == nil || !strings.Contains(err.Error(), "only for kind=cpu") {
		t.Errorf("cpu-stop with seconds: %v", err)
	}
}

// Through the runtime's query path: the answer lands in the host's memory.
func TestProfileQuery(t *testing.T) {
	r := New(newGoMemory(t), nil)
	out, msg := r.Query(&Command{Op: OpProfile, Opts: recs("kind=heap\n")})
	if out.Status != StatusOK || out.Len == 0 {
		t.Fatalf("status %d %q, %d bytes", out.Status, msg, out.Len)
	}
	gunzipped(t, Bytes(out.Data, int(out.Len)))
	r.Free(&out)
	out, msg = r.Query(&Command{Op: OpProfile, Opts: recs("kind=cpu-stop\n")})
	if out.Status != ErrGeneric || msg != "profile: no CPU profile is running in this worker" {
		t.Fatalf("stop with none running: %d %q", out.Status, msg)
	}
}
