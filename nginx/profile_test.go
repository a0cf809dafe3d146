package nginx

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestDebugProfile: qrpc.debug_profile takes pprof profiles of the Go
// runtime inside a real worker, while it serves calls: a CPU profile
// that go tool pprof reads and that shows the QUIC stack at work, a
// goroutine profile that shows the connection's goroutines; one CPU
// profile at a time; the arguments and the phase checked.
func TestDebugProfile(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/cpu", connectT+`
                -- calls during the profile, from another light thread
                local stop, bad, calls = false, 0, 0
                local th = ngx.thread.spawn(function()
                    while not stop and calls < 100000 do
                        local res = conn:unary("echo", "x")
                        calls = calls + 1
                        if not res or res.body ~= "x" then bad = bad + 1 end
                    end
                end)
                local prof, perr = qrpc.debug_profile("cpu", 1)
                stop = true
                ngx.thread.wait(th)
                if not prof then ngx.say("profile failed: ", perr) return end
                -- and the worker still serves calls after it
                local res = conn:unary("echo", "after")
                ngx.header["X-Result"] = "calls " .. (calls >= 100 and "many" or calls)
                                         .. " bad " .. bad .. " after " .. (res and res.body or "none")
                ngx.print(prof)`) +
		loc("/goroutine", connectT+`
                assert(conn:unary("echo", "x"))
                local prof, perr = qrpc.debug_profile("goroutine")
                if not prof then ngx.say("profile failed: ", perr) return end
                local heap = qrpc.debug_profile("heap")
                ngx.header["X-Result"] = "heap " .. tostring(heap and #heap > 0)
                ngx.print(prof)`) +
		loc("/twice", `
                local qrpc = require "resty.ffi.qrpc"
                -- spawn runs it up to its sleep: the profile has started
                local th = ngx.thread.spawn(qrpc.debug_profile, "cpu", 1)
                local p, err = qrpc.debug_profile("cpu", 1)
                local _, first = ngx.thread.wait(th)
                ngx.say(tostring(p), " ", err, "; first ", first and #first > 0)`) +
		loc("/args", `
                local qrpc = require "resty.ffi.qrpc"
                ngx.say(select(2, qrpc.debug_profile(1)))
                ngx.say(select(2, qrpc.debug_profile("block")))
                ngx.say(select(2, qrpc.debug_profile("cpu-stop")))
                ngx.say(select(2, qrpc.debug_profile("heap", 1)))
                ngx.say(select(2, qrpc.debug_profile("cpu", 0)))
                ngx.say(select(2, qrpc.debug_profile("cpu", 1.5)))`) + `
        location = /phase {
            header_filter_by_lua_block {
                local _, err = require("resty.ffi.qrpc").debug_profile("cpu", 1)
                ngx.header["X-Err"] = err
            }
            return 200 "ok\n";
        }
`})

	// as a user would serve them: the profile is the response's body
	profileOf := func(path, result string) []byte {
		t.Helper()
		st, body, hdr, err := n.do("GET", path, "")
		if err != nil || st != 200 || hdr.Get("X-Result") != result {
			t.Fatalf("%s: %d %v %q (%.200q)", path, st, err, hdr.Get("X-Result"), body)
		}
		return []byte(body)
	}
	// the connection's goroutines, seen from inside the worker
	if raw := gunzipped(t, profileOf("/goroutine", "heap true")); !bytes.Contains(raw, []byte("quic-go.(*Conn).run")) {
		t.Errorf("goroutine profile (%d bytes) without quic-go's connection loop", len(raw))
	}
	// loaded, but no CPU profile yet: SIGPROF as nginx left it
	if ign := sigIgnored(t, n.workerPIDs()[0]); ign&(1<<(27-1)) != 0 {
		t.Fatalf("SIGPROF ignored in the worker before any CPU profile (SigIgn %x)", ign)
	}
	prof := profileOf("/cpu", "calls many bad 0 after after")
	cpu := filepath.Join(t.TempDir(), "cpu.pb.gz")
	if err := os.WriteFile(cpu, prof, 0o644); err != nil {
		t.Fatal(err)
	}
	raw := gunzipped(t, prof)
	// the profile's string table names its sample type and the functions
	// that ran: the QUIC stack served the calls during the second
	for _, want := range []string{"cpu", "nanoseconds", "github.com/quic-go/quic-go."} {
		if !bytes.Contains(raw, []byte(want)) {
			t.Errorf("CPU profile (%d bytes) does not name %q", len(raw), want)
		}
	}
	// and go tool pprof, which docs/api.md tells users to run, reads it
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "tool", "pprof", "-top", "-nodecount=500", cpu).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Type: cpu") || !strings.Contains(string(out), "quic-go") {
		t.Errorf("go tool pprof -top: %v\n%s", err, out)
	}

	// docs/api.md: afterwards Go leaves SIGPROF ignored in the worker (a late
	// signal must not kill it), which children it starts inherit
	if ign := sigIgnored(t, n.workerPIDs()[0]); ign&(1<<(27-1)) == 0 {
		t.Errorf("SIGPROF not ignored in the worker after a CPU profile (SigIgn %x)", ign)
	}

	st, body := n.get("/twice")
	if want := "nil qrpc: profile: a CPU profile is already running in this worker; first true\n"; st != 200 || body != want {
		t.Fatalf("/twice: %d %q, want %q", st, body, want)
	}
	st, body = n.get("/args")
	want := lines(
		"bad argument #1: kind must be a string (got number)",
		"bad argument #1: kind must be cpu, heap, allocs, goroutine or threadcreate (got 'block')",
		"bad argument #1: kind must be cpu, heap, allocs, goroutine or threadcreate (got 'cpu-stop')",
		"bad argument #2: seconds is only for kind cpu",
		"bad argument #2: seconds must be 1..300 (got 0)",
		"bad argument #2: seconds must be an integer 1..300 (got 1.5)")
	if st != 200 || body != want {
		t.Fatalf("/args: %d\n%s\nwant\n%s", st, body, want)
	}
	st, _, hdr, err := n.do("GET", "/phase", "")
	if want := "qrpc: a cpu profile cannot be taken in the header_filter phase (it sleeps)"; err != nil || st != 200 || hdr.Get("X-Err") != want {
		t.Fatalf("/phase: %d %v %q, want %q", st, err, hdr.Get("X-Err"), want)
	}
}

// sigIgnored is the SigIgn mask of /proc/PID/status.
func sigIgnored(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "SigIgn:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("SigIgn %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("no SigIgn line in /proc/%d/status", pid)
	return 0
}

func gunzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("profile of %d bytes is not gzip: %v", len(b), err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("profile: %v", err)
	}
	return raw
}
