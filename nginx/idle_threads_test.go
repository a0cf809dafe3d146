package nginx

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// idleWorker starts a one-worker nginx whose /t makes a call, for the
// tests of the built-in host's idle transition (skipped on lua-resty-ffi's
// host, which has none: why says what it would lack).
func idleWorker(t *testing.T, why string) (*nginxProc, int) {
	t.Helper()
	requireNginx(t)
	if ng.Host() == "resty_ffi" {
		t.Skip("lua-resty-ffi's host has no trimmer, so " + why + " (docs/tuning.md, Idle cost)")
	}
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local res, err = conn:unary("echo", "idle ok", { timeout = 2000 })
                ngx.say(res and res.body or err)`)})
	pids := n.workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("workers %v", pids)
	}
	return n, pids[0]
}

// TestIdleWorkerThreads: once a worker that called goes idle, its Go
// runtime is down to three threads beside nginx's (m0, sysmon, the
// template thread): the threads the first calls made it start (two)
// end when the trimmer stops, and a second busy spell leaves it there
// once idle again.
func TestIdleWorkerThreads(t *testing.T) {
	n, pid := idleWorker(t, "no pass ends threads")
	threads := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	for round := range 2 {
		// A busy spell: calls from concurrent requests.
		errs := make(chan error, 20)
		for range cap(errs) {
			go func() {
				if st, body := n.get("/t"); st != 200 || body != "idle ok\n" {
					errs <- fmt.Errorf("%d %q", st, body)
					return
				}
				errs <- nil
			}()
		}
		for range cap(errs) {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		busy := threads()
		n.client.CloseIdleConnections()
		// The trimmer stops within two of its bufcache periods of the
		// last call (docs/tuning.md), then the threads end.
		if !testwait.For(30*time.Second, func() bool { return threads() <= 1+3 }) {
			t.Fatalf("round %d: the idle worker still has %d threads (nginx's and Go's; %d after the calls):%s", round, threads(), busy, procState(pid))
		}
		t.Logf("round %d: %d threads after the calls, %d idle", round, busy, threads())
	}
}

// libraryClean is the kB of the library's clean read-only mappings
// resident in process pid (smaps: not writable, no private page), what
// an idle worker gives back (internal/resident).
func libraryClean(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	total, lib, rss := 0, false, 0
	flush := func(anon int) {
		if lib && anon == 0 {
			total += rss
		}
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 6 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			lib = f[5] == libPath && f[1][1] == '-' && f[1][3] == 'p'
			rss = 0
		case len(f) >= 2 && f[0] == "Rss:":
			rss, _ = strconv.Atoi(f[1])
		case len(f) >= 2 && f[0] == "Anonymous:":
			anon, _ := strconv.Atoi(f[1])
			flush(anon)
		}
	}
	return total
}

// TestIdleWorkerReleasesLibrary: a worker idle for a while drops its
// mappings of the library's clean read-only pages (code and read-only
// data, some 12 MB resident after a call), keeping what the idle
// runtime touches; the next call maps back what it needs and works.
func TestIdleWorkerReleasesLibrary(t *testing.T) {
	n, pid := idleWorker(t, "nothing tells the library the worker is idle")
	for round := range 2 {
		if st, body := n.get("/t"); st != 200 || body != "idle ok\n" {
			t.Fatalf("round %d: %d %q", round, st, body)
		}
		busy := libraryClean(t, pid)
		n.client.CloseIdleConnections()
		// The trimmer stops within two bufcache periods of the last
		// call, and the release follows 5 s later (docs/tuning.md).
		var idle int
		if !testwait.For(45*time.Second, func() bool { idle = libraryClean(t, pid); return idle <= busy/2 }) {
			t.Fatalf("round %d: the idle worker still maps %d kB of the library's read-only pages (%d after the call)", round, idle, busy)
		}
		t.Logf("round %d: %d kB of the library's read-only pages resident after the call, %d idle", round, busy, idle)
	}
}
