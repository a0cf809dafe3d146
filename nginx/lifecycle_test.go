package nginx

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

const greetLoc = `
        location = /t {
            content_by_lua_block {
                local qt = require "qtest"
                local conn, err = qt.connect()
                if not conn then ngx.status = 502 ngx.say("connect failed: ", err) return end
                local res, err = conn:unary("greet", ngx.var.arg_n or "x", { timeout = 3000 })
                if not res then ngx.status = 502 ngx.say("unary failed: ", err) return end
                ngx.print(res.body)
            }
        }
`

func TestConcurrentRequests(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Server: greetLoc + loc("/threads", connectT+`
                -- 100 light threads of one request, 10 calls each, all in flight together
                local threads = {}
                for i = 1, 100 do
                    threads[i] = ngx.thread.spawn(function()
                        for j = 1, 10 do
                            local want = i .. "." .. j
                            local res, err = conn:unary("echo", want)
                            if not res or res.body ~= want then
                                return false, tostring(err or res.body)
                            end
                        end
                        return true
                    end)
                end
                local good = 0
                for i = 1, 100 do
                    local ok, res, err = ngx.thread.wait(threads[i])
                    if ok and res then good = good + 1 else ngx.say(i, ": ", err) end
                end
                ngx.say("good threads: ", good)`)})
	for round := 0; round < 2; round++ {
		const c = 200
		var wg sync.WaitGroup
		errs := make(chan string, c)
		start := make(chan struct{})
		for i := 0; i < c; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				st, body, _, err := n.do("GET", fmt.Sprintf("/t?n=%d", i), "")
				if want := fmt.Sprintf("hello, %d", i); err != nil || st != 200 || body != want {
					errs <- fmt.Sprintf("request %d: %d %q %v", i, st, body, err)
				}
			}(i)
		}
		close(start)
		wg.Wait()
		close(errs)
		failed := 0
		for e := range errs {
			if failed < 5 {
				t.Error(e)
			}
			failed++
		}
		if failed > 0 {
			t.Fatalf("round %d: %d of %d concurrent requests failed", round, failed, c)
		}
	}
	if st, body := n.get("/threads"); st != 200 || body != "good threads: 100\n" {
		t.Errorf("/threads: %d %q", st, body)
	}
}

func TestConnectionReuse(t *testing.T) {
	requireNginx(t)
	t.Run("across requests", func(t *testing.T) {
		t.Parallel()
		srv := ownServer(t)
		n := startNginx(t, ngxConf{QServer: srv, Server: greetLoc})
		for i := 0; i < 30; i++ {
			if st, body := n.get("/t?n=seq"); st != 200 || body != "hello, seq" {
				t.Fatalf("%d %q", st, body)
			}
		}
		var wg sync.WaitGroup
		var bad atomic.Int32
		for i := 0; i < 30; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if st, body, _, err := n.do("GET", "/t?n=par", ""); err != nil || st != 200 || body != "hello, par" {
					bad.Add(1)
				}
			}()
		}
		wg.Wait()
		if bad.Load() > 0 {
			t.Fatalf("%d parallel requests failed", bad.Load())
		}
		// At most one connection per worker carried those 60 calls.
		if c := srv.connCount(); c < 1 || c > 2 {
			t.Errorf("the server saw %d connections for 60 requests over 2 workers, want 1 or 2", c)
		}
		for i := 0; i < 6; i++ {
			if _, body := n.get("/stats"); !strings.Contains(body, "connections=1 ") && !strings.Contains(body, "loaded=false") {
				t.Errorf("/stats: %q", body)
			}
		}
	})
	t.Run("concurrent connects share one dial", func(t *testing.T) {
		t.Parallel()
		srv := ownServer(t)
		n := startNginx(t, ngxConf{QServer: srv, Workers: 1, Server: loc("/t", `
                local qt = require "qtest"
                local threads, conns = {}, {}
                for i = 1, 20 do
                    threads[i] = ngx.thread.spawn(function()
                        local conn, err = qt.connect()
                        if not conn then return nil, err end
                        local res, err = conn:unary("echo", "x")
                        return conn, res and res.body or err
                    end)
                end
                local distinct, n = {}, 0
                for i = 1, 20 do
                    local ok, conn, body = ngx.thread.wait(threads[i])
                    if conn and not distinct[conn] then distinct[conn] = true n = n + 1 end
                    if body ~= "x" then ngx.say("thread ", i, ": ", body) end
                end
                ngx.say("distinct connection objects: ", n)`)})
		if st, body := n.get("/t"); st != 200 || body != "distinct connection objects: 1\n" {
			t.Fatalf("%d %q", st, body)
		}
		if c := srv.connCount(); c != 1 {
			t.Errorf("the server saw %d connections, want 1", c)
		}
	})
}

func TestClientAbortFreesTheCall(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{
		Workers: 1,
		Server: `
        location = /slow {
            lua_check_client_abort on;
            content_by_lua_block {
                local qt = require "qtest"
                local conn = assert(qt.connect())
                local res, err = conn:unary("slow", "4000", { timeout = 10000 })
                ngx.say(res and res.body or err)
            }
        }
`})
	// A connection first, so that the aborted request's call is sent at once.
	if _, body := n.get("/stats"); !strings.Contains(body, "inflight=0") {
		t.Fatalf("/stats: %q", body)
	}
	c, err := net.Dial("tcp", n.addr())
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if _, err := fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	inflight := regexp.MustCompile(`inflight=(\d+) waiting=(\d+)`)
	stat := func() (string, string) {
		_, body := n.get("/stats")
		m := inflight.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("/stats: %q", body)
		}
		return m[1], m[2]
	}
	if err := eventually(5*time.Second, func() error {
		if f, w := stat(); f != "1" || w != "1" {
			return fmt.Errorf("inflight=%s waiting=%s, want the slow call in flight", f, w)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	aborted := time.Now()
	_ = c.Close()
	if ng.Host() == "resty_ffi" {
		// lua-resty-ffi tells nobody that the request went away (docs/api.md, conn:unary):
		// Go runs the call until the server answers (4 s after the call
		// was sent), and waiting counts it until its deadline (10 s + 1 s).
		if err := eventually(10*time.Second, func() error {
			if f, _ := stat(); f != "0" {
				return fmt.Errorf("inflight=%s", f)
			}
			return nil
		}); err != nil {
			t.Fatalf("the aborted request's call did not end when the server answered: %v", err)
		}
		ended := time.Since(aborted)
		if d := time.Since(sent); d < 3900*time.Millisecond {
			t.Errorf("the call ended %v after it was sent, before the server answered: was it cancelled after all? update docs/api.md", d)
		}
		if _, w := stat(); w != "1" {
			t.Errorf("waiting=%s once Go answered, want 1 until the deadline", w)
		}
		if err := eventually(12*time.Second-time.Since(sent), func() error {
			if _, w := stat(); w != "0" {
				return fmt.Errorf("waiting=%s", w)
			}
			return nil
		}); err != nil {
			t.Fatalf("waiting did not drop by the call's deadline: %v", err)
		}
		t.Logf("lua-resty-ffi host: the call ended %v after the client aborted, waiting dropped %v after",
			ended.Round(10*time.Millisecond), time.Since(aborted).Round(10*time.Millisecond))
		return
	}
	// The slow handler answers after 4 s and the call's deadline is 10 s:
	// only the abort can free it before.
	if err := eventually(3*time.Second, func() error {
		if f, w := stat(); f != "0" || w != "0" {
			return fmt.Errorf("inflight=%s waiting=%s", f, w)
		}
		return nil
	}); err != nil {
		t.Fatalf("the aborted request's call was not freed: %v", err)
	}
	t.Logf("call freed %v after the client aborted", time.Since(aborted).Round(10*time.Millisecond))
	if c := n.logCount(`no completion for call`); c > 0 {
		t.Errorf("Lua's safety net fired %d times", c)
	}
}

func TestServerRestartRecovers(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	srv := ownServer(t)
	n := startNginx(t, ngxConf{QServer: srv, Workers: 1, Server: loc("/t", connectT+`
                local res, err = conn:unary("echo", "up", { timeout = 1000 })
                ngx.say(res and res.body or err, " reconnects=", conn:stats().reconnects)`)})
	if st, body := n.get("/t"); st != 200 || body != "up reconnects=0\n" {
		t.Fatalf("%d %q", st, body)
	}
	if err := srv.restart(500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The client re-dials with backoff (1 s, x1.6, jitter); nginx is not
	// restarted and the Lua connection object stays the same.
	var last string
	start := time.Now()
	err := eventually(15*time.Second, func() error {
		_, last = n.get("/t")
		if strings.HasPrefix(last, "up ") {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		t.Fatalf("no recovery within 15 s after the server restarted; last answer %q", last)
	}
	t.Logf("recovered %v after the restart: %q", time.Since(start).Round(10*time.Millisecond), last)
	if last == "up reconnects=0\n" {
		t.Errorf("recovered without a reconnect counted: %q", last)
	}
}

// loadLoop sends GET path from c goroutines until stop is closed; it returns
// the number of successes and the failures.
func loadLoop(n *nginxProc, path, want string, c int, stop <-chan struct{}) (func() (int, []string), *sync.WaitGroup) {
	var mu sync.Mutex
	var ok int
	var fails []string
	var wg sync.WaitGroup
	for i := 0; i < c; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				st, body, _, err := n.do("GET", path, "")
				mu.Lock()
				if err != nil || st != 200 || body != want {
					fails = append(fails, fmt.Sprintf("%s: %d %q %v", time.Now().Format("15:04:05.000"), st, body, err))
				} else {
					ok++
				}
				mu.Unlock()
			}
		}()
	}
	return func() (int, []string) {
		mu.Lock()
		defer mu.Unlock()
		return ok, append([]string(nil), fails...)
	}, &wg
}

func TestReloadUnderLoad(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Server: greetLoc})
	const conc = 4
	stop := make(chan struct{})
	result, wg := loadLoop(n, "/t?n=load", "hello, load", conc, stop)
	// Under way: 10 answers per client before the reload, 10 after the
	// old workers are gone.
	answered := func(k int, what string) {
		t.Helper()
		if err := eventually(30*time.Second, func() error {
			if ok, _ := result(); ok < k {
				return fmt.Errorf("%s: %d of %d answers", what, ok, k)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	answered(10*conc, "before the reload")
	old := n.workerPIDs()
	before, _ := result()
	n.signal("reload")
	reloaded := time.Now()
	// The old workers hold qrpc connections and a dispatcher: they must
	// still leave promptly.
	err := eventually(5*time.Second, func() error {
		for _, p := range old {
			if pidAlive(p) {
				return fmt.Errorf("old worker %d still alive", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("after reload: %v (Kong#6904-style hang)", err)
	} else {
		t.Logf("old workers gone %v after the reload", time.Since(reloaded).Round(10*time.Millisecond))
	}
	now, _ := result()
	answered(now+10*conc, "after the reload")
	close(stop)
	wg.Wait()
	ok, fails := result()
	t.Logf("%d requests before the reload, %d in all, %d failed", before, ok+len(fails), len(fails))
	// Only requests in flight at the moment of the reload may fail.
	if len(fails) > conc {
		t.Errorf("%d requests failed (at most %d were in flight at the reload):\n%s", len(fails), conc, strings.Join(fails, "\n"))
	}
	if ok < 50 {
		t.Errorf("only %d successful requests", ok)
	}
	// An old worker that has exited stays listed until the master reaps
	// it (slow on a loaded machine): a bounded wait for the two new ones.
	var newWorkers []int
	if err := eventually(10*time.Second, func() error {
		if newWorkers = n.workerPIDs(); len(newWorkers) != 2 {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Errorf("workers after reload: %v", newWorkers)
	}
}

// TestCallsInFlightFinish: calls waiting for a slow server when nginx is
// told to quit or reload all complete, on every host (lua-resty-ffi's
// waits arm no timer: the library must keep the old worker alive), and the
// old workers then leave.
func TestCallsInFlightFinish(t *testing.T) {
	requireNginx(t)
	for _, sig := range []string{"quit", "reload"} {
		t.Run(sig, func(t *testing.T) {
			t.Parallel()
			srv := ownServer(t)
			n := startNginx(t, ngxConf{QServer: srv, Server: loc("/slow", connectT+`
                local res, err = conn:unary("slow", "1500", { timeout = 5000 })
                ngx.say(res and res.body or err, " ", qrpc.stats().host)`)})
			const c = 6
			var wg sync.WaitGroup
			results := make(chan string, c)
			for i := 0; i < c; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, body, _, err := n.do("GET", "/slow", "")
					results <- fmt.Sprintf("%d %q %v", st, body, err)
				}()
			}
			if err := eventually(5*time.Second, func() error {
				srv.mu.Lock()
				defer srv.mu.Unlock()
				if srv.slow != c {
					return fmt.Errorf("%d slow calls running at the server", srv.slow)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			workers := n.workerPIDs()
			n.client.CloseIdleConnections() // see nginxProc.stop
			start := time.Now()
			n.signal(sig)
			if sig == "quit" {
				if !n.waitExit(5 * time.Second) {
					t.Fatalf("nginx -s quit with calls in flight: still running after 5 s (workers %v)", workers)
				}
			} else if err := eventually(5*time.Second, func() error {
				for _, p := range workers {
					if pidAlive(p) {
						return fmt.Errorf("old worker %d still alive", p)
					}
				}
				return nil
			}); err != nil {
				t.Fatalf("nginx -s reload with calls in flight: %v", err)
			}
			t.Logf("old workers gone %v after -s %s", time.Since(start).Round(10*time.Millisecond), sig)
			wg.Wait()
			close(results)
			want := fmt.Sprintf(`200 "slept 1500 %s\n" <nil>`, ng.Host())
			for r := range results {
				if r != want {
					t.Errorf("request in flight at %s: %s, want %s", sig, r, want)
				}
			}
			for _, p := range workers {
				if pidAlive(p) {
					t.Errorf("worker %d still alive", p)
				}
			}
		})
	}
}

// moduleLine matches a jit.v line that names a file of the module family
// (resty/ffi/qrpc.lua, resty/ffi/qrpc/*.lua); jit.v prints base names.
func moduleLine(t *testing.T) *regexp.Regexp {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "lua", "resty", "ffi", "qrpc", "*.lua"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no lua/resty/ffi/qrpc/*.lua (%v)", err)
	}
	names := []string{"qrpc"}
	for _, f := range files {
		names = append(names, regexp.QuoteMeta(strings.TrimSuffix(filepath.Base(f), ".lua")))
	}
	return regexp.MustCompile(`\b(` + strings.Join(names, "|") + `)\.lua:`)
}

// TestJITHotLoop checks, as lua-resty-core's tests do, that unary's code
// does not abort traces with NYI: a loop of calls runs under jit.v.
func TestJITHotLoop(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local v = require "jit.v"
                local qt = require "qtest"
                v.on(qt.dir .. "/run/jit.log")
                local opts = { headers = { ["x-a"] = "1" }, timeout = 2000 }
                local bad = 0
                for i = 1, 300 do
                    local res = conn:unary("echo", "jit", i % 2 == 0 and opts or nil)
                    if not res or res.body ~= "jit" then bad = bad + 1 end
                    conn:event("count", "jit")
                end
                v.off()
                ngx.say("bad ", bad)`)})
	if st, body := n.get("/t"); st != 200 || body != "bad 0\n" {
		t.Fatalf("%d %q", st, body)
	}
	ours := moduleLine(t)
	sc := bufio.NewScanner(strings.NewReader(n.readFile("run/jit.log")))
	var nyi []string
	traces := 0
	for sc.Scan() {
		l := sc.Text()
		if !ours.MatchString(l) {
			continue
		}
		if strings.Contains(l, "[TRACE") && !strings.Contains(l, "abort") {
			traces++
		}
		if strings.Contains(l, "NYI") {
			nyi = append(nyi, l)
		}
	}
	t.Logf("%d traces through the module's files", traces)
	if traces == 0 {
		t.Errorf("no trace through the module's files in jit.log")
	}
	if len(nyi) > 0 {
		t.Errorf("NYI in the module's traces:\n%s", strings.Join(nyi, "\n"))
	}
}

// TestJITSequentialNoAborts: one call at a time, the built-in host's
// completion path (the dispatcher's drain) compiles without a trace
// abort. jit.flush() first, so that every trace of the loop is recorded
// inside it; a loop that runs once per call aborted its root trace each
// time it got hot ("leaving loop in root trace").
func TestJITSequentialNoAborts(t *testing.T) {
	requireNginx(t)
	if ng.Host() == "resty_ffi" {
		t.Skip("the lua-resty-ffi host completes calls its own way")
	}
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local v = require "jit.v"
                local qt = require "qtest"
                assert(conn:unary("echo", "warm"))
                jit.flush()
                v.on(qt.dir .. "/run/jit.log")
                local bad = 0
                for _ = 1, 2000 do
                    local res = conn:unary("echo", "jit")
                    if not res or res.body ~= "jit" then bad = bad + 1 end
                end
                v.off()
                ngx.say("bad ", bad)`)})
	if st, body := n.get("/t"); st != 200 || body != "bad 0\n" {
		t.Fatalf("%d %q", st, body)
	}
	ours := moduleLine(t)
	sc := bufio.NewScanner(strings.NewReader(n.readFile("run/jit.log")))
	var aborts []string
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "[TRACE --- ") && ours.MatchString(l) {
			aborts = append(aborts, l)
		}
	}
	if len(aborts) > 0 {
		t.Errorf("%d trace aborts in the module's files:\n%s", len(aborts), strings.Join(aborts, "\n"))
	}
}

// TestCallAfterDispatcherStopped: a request still running when the worker
// starts exiting makes its first call after the dispatcher has already
// stopped (no call was waiting); the call must still complete.
func TestCallAfterDispatcherStopped(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, LogLevel: "info", Server: loc("/late", connectT+`
                ngx.log(ngx.NOTICE, "late request in")
                -- until the dispatcher has stopped (quit), bounded
                local qrpc = require "resty.ffi.qrpc"
                qt.wait(10, function() return not qrpc.stats().dispatcher end)
                local res, err = conn:unary("echo", "late ok", { timeout = 2000 })
                ngx.say(res and res.body or err, " exiting=", ngx.worker.exiting())`)})
	done := make(chan string, 1)
	go func() {
		st, body, _, err := n.do("GET", "/late", "")
		done <- fmt.Sprintf("%d %q %v", st, body, err)
	}()
	if err := eventually(10*time.Second, func() error {
		if n.logCount(`late request in`) == 0 {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatal("the request never reached its handler")
	}
	n.client.CloseIdleConnections()
	n.signal("quit")
	select {
	case r := <-done:
		if r != `200 "late ok exiting=true\n" <nil>` {
			t.Errorf("request in flight at quit: %s", r)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the request did not complete")
	}
	if !n.waitExit(5 * time.Second) {
		t.Fatal("nginx did not exit")
	}
	if c := n.logCount(`qrpc: dispatcher stopped`); c < 1 {
		t.Errorf("the dispatcher never stopped (%d)", c)
	}
}

// TestDispatcherReopensItsSocket takes the wake-up socket away from the
// dispatcher (another connection to a fresh qrpc_vm_wake_open socket makes Go
// drop the dispatcher's); the dispatcher notices, opens a new one, and
// calls keep completing.
func TestDispatcherReopensItsSocket(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                assert(conn:unary("echo", "before"))
                local ffi = require "ffi"
                local lib = ffi.load(qt.lib)
                local path, errbuf = ffi.new("char[256]"), ffi.new("char[256]")
                local dir = qt.dir .. "/run"
                assert(lib.qrpc_vm_wake_open(0, dir, #dir, path, 256, errbuf, 256) == 0, ffi.string(errbuf))
                local thief = ngx.socket.tcp()
                assert(thief:connect("unix:" .. ffi.string(path)))
                -- the calls start once the dispatcher has seen its socket
                -- taken (its warning logged), while it reopens one
                local seen = qt.wait(10, function() return qt.logged("%[warn%].*qrpc: wake%-up socket: closed") end)
                local ok = 0
                for i = 1, 20 do
                    local res = conn:unary("echo", "after " .. i, { timeout = 3000 })
                    if res and res.body == "after " .. i then ok = ok + 1 end
                end
                thief:close()
                ngx.say("theft seen: ", seen, " calls after the theft: ", ok, " dispatcher: ", qrpc.stats().dispatcher)`)})
	if st, body := n.get("/t"); st != 200 || body != "theft seen: true calls after the theft: 20 dispatcher: true\n" {
		t.Fatalf("%d %q", st, body)
	}
	if n.logCount(`\[warn\].*qrpc: wake-up socket: closed`) == 0 {
		t.Error("the dispatcher did not notice that its socket was taken")
	}
}

// TestCompletionErrorLosesNothing makes the Lua completion of one call raise
// (abi.decode_result patched before the library loads) in the middle of a
// batch of 40: the other 39 complete, the failing call gets its error at
// once instead of its timeout, and the dispatcher's reader keeps running.
// Before drain caught errors, the batch's later completions were lost (their
// calls timed out, their blocks leaked) and the dead reader left every later
// call waiting for the dispatcher's half-second poll.
func TestCompletionErrorLosesNothing(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: `
        local abi = require "resty.ffi.qrpc.abi"
        local decode = abi.decode_result
        abi.decode_result = function(p, len)
            local res = decode(p, len)
            if res and res.body:sub(1, 5) == "raise" then
                error("injected failure")
            end
            return res
        end
        local qt = require "qtest" -- it loads resty.ffi.qrpc: after the patch
        assert(require("resty.ffi.qrpc").configure{ host = "builtin", lib = qt.lib, socket_dir = qt.dir .. "/run" })`,
		Server: loc("/t", connectT+`
                local function call(body)
                    local t0 = ngx.now()
                    local res, cerr = conn:unary("echo", body, { timeout = 3000 })
                    ngx.update_time()
                    return res and res.body == body, cerr, ngx.now() - t0
                end
                assert(call("warm"))
                local threads = {}
                for i = 1, 40 do
                    threads[i] = ngx.thread.spawn(call, i == 20 and "raise" or "call " .. i)
                end
                local ok, failed, slow = 0, "", 0
                for i = 1, 40 do
                    local _, good, cerr, secs = ngx.thread.wait(threads[i])
                    if good then ok = ok + 1 elseif i == 20 then failed = cerr end
                    if secs > 1 then slow = slow + 1 end
                end
                -- after it, sequential calls: each waits for the reader's wake-up
                local after, after_slow = 0, 0
                for i = 1, 10 do
                    local good, _, secs = call("after " .. i)
                    if good then after = after + 1 end
                    if secs > 0.25 then after_slow = after_slow + 1 end
                end
                -- Blocks: every failing completion's result block must go
                -- back (queued for release before it is decoded). 200 of
                -- 256 KB each leak 50 MB; released, Go's buffer cache
                -- serves them again and RSS stays put.
                local function rss_mb()
                    local f = assert(io.open("/proc/self/status"))
                    local kb = f:read("*a"):match("VmRSS:%s*(%d+)")
                    f:close()
                    return tonumber(kb) / 1024
                end
                local big = string.rep("b", 256 * 1024)
                for _ = 1, 20 do assert(call(big)) end
                local rss0 = rss_mb()
                local raised = 0
                for _ = 1, 200 do
                    local good, cerr = call("raise" .. big)
                    if not good and cerr and cerr:find("injected failure", 1, true) then
                        raised = raised + 1
                    end
                end
                local grew = rss_mb() - rss0
                ngx.log(ngx.NOTICE, "rss grew ", string.format("%.1f", grew),
                        " MB over 200 failed completions of 256 KB")
                ngx.say("ok=", ok, " failed=", failed, " slow=", slow,
                        " after=", after, " after_slow=", after_slow,
                        " raised=", raised, " leak=", grew > 20 and "yes" or "no",
                        " waiting=", qrpc.stats().waiting)`),
		AllowErrors: []string{`qrpc: completion of call \d+ failed: .*injected failure`},
	})
	st, body := n.get("/t")
	want := "ok=39 failed=qrpc: completion failed: "
	if st != 200 || !strings.HasPrefix(body, want) || !strings.HasSuffix(body, " slow=0 after=10 after_slow=0 raised=200 leak=no waiting=0\n") ||
		!strings.Contains(body, "injected failure") {
		t.Fatalf("%d %q, want %q... slow=0 after=10 after_slow=0 raised=200 leak=no waiting=0", st, body, want)
	}
	if c := n.logCount(`qrpc: completion of call \d+ failed`); c != 201 {
		t.Errorf("%d error lines for the failed completions, want 201", c)
	}
}

// A call's answer and its own wait's end handled in one turn of a stalled
// event loop: the dispatcher posts the call's semaphore, the wait's timer
// resumes the call first, and the post's count stays on the semaphore.
// Pooled as it is, that semaphore would end the next call at once with no
// answer (a false "timeout" and a "no completion" warning).
func TestStalledLoopLeavesNoStaleWakeup(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{
		Workers: 1,
		Server: loc("/t", connectT+`
                assert(conn:unary("echo", "warm", { timeout = 3000 }))
                -- The wait of this call ends 100 ms + the safety slack after
                -- it starts; its answer comes at once. The loop is stalled
                -- past both, so nginx handles them in one turn.
                local th = ngx.thread.spawn(function()
                    return conn:unary("echo", "stalled", { timeout = 100 })
                end)
                ngx.update_time()
                local stop = ngx.now() + 1.6
                while ngx.now() < stop do
                    for _ = 1, 10000 do end
                    ngx.update_time()
                end
                local _, res, cerr = ngx.thread.wait(th)
                local good = 0
                for i = 1, 20 do
                    local r = conn:unary("echo", "after " .. i, { timeout = 3000 })
                    if r and r.body == "after " .. i then good = good + 1 end
                end
                ngx.say("stalled=", res and res.body or cerr, " after=", good)`),
	})
	st, body := n.get("/t")
	// The stalled call itself may end either way; the calls after it may not.
	if st != 200 || !strings.HasSuffix(body, " after=20\n") {
		t.Fatalf("%d %q, want ... after=20", st, body)
	}
	if c := n.logCount(`no completion for call`); c != 0 {
		t.Errorf("%d 'no completion' warnings", c)
	}
}

// TestPooledWaitersAfterEveryEnd: waiters go back to the pool after every
// way a wait ends (an answer, Go's timeout, both in one turn of a stalled
// loop, a light thread killed while it waits) and none of them may end a
// later call at once. The later calls run 20 at a time, so that every
// pooled waiter is taken again, not only the last one put back.
func TestPooledWaitersAfterEveryEnd(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{
		Workers: 1,
		Server: loc("/t", connectT+`
                assert(conn:unary("echo", "warm", { timeout = 3000 }))
                local bad = 0
                for round = 1, 2 do
                    local ths = {}
                    for i = 1, 12 do
                        local kind = (i + round) % 4
                        ths[i] = ngx.thread.spawn(function()
                            if kind == 0 then
                                return conn:unary("echo", "x", { timeout = 100 })
                            elseif kind == 1 then
                                return conn:unary("slow", "50", { timeout = 100 })
                            elseif kind == 2 then
                                return conn:unary("slow", "300", { timeout = 100 })
                            end
                            return conn:unary("slow", "2000", { timeout = 3000 })
                        end)
                    end
                    ngx.sleep(0.02)
                    for i = 3, 12, 4 do ngx.thread.kill(ths[i]) end
                    if round == 1 then
                        -- past the waits' ends (100 ms + the safety slack)
                        -- and the answers: one turn handles both
                        ngx.update_time()
                        local stop = ngx.now() + 1.3
                        while ngx.now() < stop do
                            for _ = 1, 10000 do end
                            ngx.update_time()
                        end
                    end
                    for i = 1, 12 do
                        if i % 4 ~= 3 then ngx.thread.wait(ths[i]) end
                    end
                    for _ = 1, 2 do
                        local as = {}
                        for j = 1, 20 do
                            as[j] = ngx.thread.spawn(function()
                                return conn:unary("echo", "after " .. j, { timeout = 3000 })
                            end)
                        end
                        for j = 1, 20 do
                            local _, r = ngx.thread.wait(as[j])
                            if not r or r.body ~= "after " .. j then bad = bad + 1 end
                        end
                    end
                end
                ngx.say("bad=", bad)`),
	})
	if st, body := n.get("/t"); st != 200 || body != "bad=0\n" {
		t.Fatalf("%d %q, want bad=0", st, body)
	}
}

// waitGoQuiet waits until the Go threads of worker pid (all but nginx's)
// have not run for three of the built-in host's trimmer periods (0.5 s:
// it ticks that often while it runs), so that the worker's idle
// transition is over.
func waitGoQuiet(t *testing.T, pid int) {
	t.Helper()
	goSwitches := func() int64 {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, e := range ents {
			if e.Name() == strconv.Itoa(pid) {
				continue
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, e.Name()))
			if err != nil {
				continue // the thread ended
			}
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
					c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					sum += c
				}
			}
		}
		return sum
	}
	last, since := goSwitches(), time.Now()
	if !testwait.For(45*time.Second, func() bool {
		if c := goSwitches(); c != last {
			last, since = c, time.Now()
		}
		return time.Since(since) >= 1500*time.Millisecond
	}) {
		t.Fatalf("the worker's Go threads never stayed quiet for 1.5 s:%s", procState(pid))
	}
}

// TestIdleDispatcherSleeps: once no call is in flight (and the built-in
// host's idle transition is over), the dispatcher does not wake the
// worker's nginx thread (counted in the thread's
// voluntary context switches, against a plain worker of another nginx
// over the same 3 s: OpenResty's workers wake every second to reap
// children, with or without this module; a poll every 0.5 s would make 6
// more), a later call still completes at once, and the idle worker still
// leaves promptly on quit.
func TestIdleDispatcherSleeps(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local res, err = conn:unary("echo", "idle ok", { timeout = 2000 })
                ngx.say(res and res.body or err)`)})
	if st, body := n.get("/t"); st != 200 || body != "idle ok\n" {
		t.Fatalf("%d %q", st, body)
	}
	pids := n.workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("workers %v", pids)
	}
	pid := pids[0]
	plain := startNginx(t, ngxConf{Workers: 1, Server: loc("/p", `ngx.say("plain")`)})
	if st, body := plain.get("/p"); st != 200 || body != "plain\n" {
		t.Fatalf("plain nginx: %d %q", st, body)
	}
	plainPIDs := plain.workerPIDs()
	if len(plainPIDs) != 1 {
		t.Fatalf("plain workers %v", plainPIDs)
	}
	switches := func(pid int) int {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				c, _ := strconv.Atoi(strings.TrimSpace(v))
				return c
			}
		}
		t.Fatal("no voluntary_ctxt_switches")
		return 0
	}
	// Past the call's last poll (0.5 s) and its HTTP connection's close.
	n.client.CloseIdleConnections()
	plain.client.CloseIdleConnections()
	time.Sleep(time.Second) // the scenario: idle for 1 s before the window
	// And past the built-in host's idle transition (the trimmer's last
	// ticks): on a loaded machine sysmon preempts Go code with signals,
	// each of which wakes an OpenResty worker's nginx thread through the
	// signalfd it watches SIGCHLD with (docs/tuning.md, Idle cost).
	waitGoQuiet(t, pid)
	before, plainBefore := switches(pid), switches(plainPIDs[0])
	time.Sleep(3 * time.Second) // the scenario: the 3 s idle window both workers are compared over
	d, pd := switches(pid)-before, switches(plainPIDs[0])-plainBefore
	if d > pd+1 {
		t.Errorf("the idle worker's nginx thread woke %d times in 3 s, a plain worker's %d", d, pd)
	}
	t.Logf("nginx thread wake-ups in 3 s idle: %d, a plain worker's %d", d, pd)
	began := time.Now()
	if st, body := n.get("/t"); st != 200 || body != "idle ok\n" {
		t.Fatalf("the call after the idle time: %d %q", st, body)
	}
	t.Logf("the call after the idle window took %v", time.Since(began).Round(time.Millisecond))
	// Idle again, then quit: the exit watch must wake the dispatcher (it
	// would otherwise sleep for an hour and keep the worker).
	n.client.CloseIdleConnections()
	time.Sleep(time.Second) // the scenario: idle for 1 s before the quit
	n.signal("quit")
	if !n.waitExit(5 * time.Second) {
		t.Fatalf("an idle worker did not exit within 5 s of quit:%s", procState(pid))
	}
}
