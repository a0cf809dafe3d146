package nginx

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// TestIdleWorkerThreads: once a worker that called goes idle, its Go
// runtime is down to three threads beside nginx's (m0, sysmon, the
// template thread): the threads the first calls made it start (two)
// end when the trimmer stops, and a second busy spell leaves it there
// once idle again.
func TestIdleWorkerThreads(t *testing.T) {
	requireNginx(t)
	if ng.Host() == "resty_ffi" {
		t.Skip("lua-resty-ffi's host has no trimmer, so no pass ends threads (docs/tuning.md, Idle cost)")
	}
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local res, err = conn:unary("echo", "idle ok", { timeout = 2000 })
                ngx.say(res and res.body or err)`)})
	pids := n.workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("workers %v", pids)
	}
	pid := pids[0]
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
