package nginx

import (
	"bufio"
	"fmt"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The stream subsystem (ngx_stream_lua): a stream {} server runs the same
// Lua (testdata/qstream.lua) as an http location, one request line per
// answer line over TCP. These tests need an nginx with ngx_stream_lua
// (the openresty flavour: make test-openresty).

func requireStreamLua(t *testing.T) {
	t.Helper()
	requireNginx(t)
	if !ng.StreamLua {
		t.Skipf("%s: the stream tests need ngx_stream_lua (QRPC_NGINX=openresty, make test-openresty)", ng.NoStreamLua)
	}
}

// streamServers: a line server on StreamPort (with a log-phase check) and
// one on StreamPort2 whose preread phase makes a call first.
const streamServers = `
    server {
        listen 127.0.0.1:{{.StreamPort}};
        content_by_lua_block { require("qstream").serve() }
        log_by_lua_block { require("qstream").log() }
    }
    server {
        listen 127.0.0.1:{{.StreamPort2}};
        preread_by_lua_block { require("qstream").preread() }
        content_by_lua_block { require("qstream").serve() }
    }
`

// lineLocation answers one qstream line given as ?l=, in the http VM.
var lineLocation = loc("/line", `
                ngx.say(require("qstream").one(ngx.unescape_uri(ngx.var.arg_l or "")))`)

// streamConf is an nginx with the line servers in both subsystems.
func streamConf(workers int) ngxConf {
	return ngxConf{Workers: workers, Stream: streamServers, Server: lineLocation}
}

// lineClient is one TCP connection to a stream line server.
type lineClient struct {
	c net.Conn
	r *bufio.Reader
}

func dialLines(port int, timeout time.Duration) (*lineClient, error) {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), timeout)
	if err != nil {
		return nil, err
	}
	return &lineClient{c: c, r: bufio.NewReader(c)}, nil
}

// ask sends a line and reads the answer line, within timeout.
func (l *lineClient) ask(line string, timeout time.Duration) (string, error) {
	_ = l.c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(l.c, line+"\n"); err != nil {
		return "", err
	}
	s, err := l.r.ReadString('\n')
	return strings.TrimSuffix(s, "\n"), err
}

func (l *lineClient) close() { _ = l.c.Close() }

// streamAsk answers one line on a connection of its own.
func streamAsk(t *testing.T, port int, line string) string {
	t.Helper()
	l, err := dialLines(port, 5*time.Second)
	if err != nil {
		t.Fatalf("dial stream port %d: %v", port, err)
	}
	defer l.close()
	s, err := l.ask(line, 30*time.Second)
	if err != nil {
		t.Fatalf("stream %q: %v", line, err)
	}
	return s
}

// httpAsk answers one line through the http VM.
func httpAsk(t *testing.T, n *nginxProc, line string) string {
	t.Helper()
	st, body := n.get("/line?l=" + url.QueryEscape(line))
	if st != 200 {
		t.Fatalf("http %q: status %d %q", line, st, body)
	}
	return strings.TrimSuffix(body, "\n")
}

// TestStreamContract: every API in the stream subsystem (preread,
// content, timer and log phases), with the same answers, errors and
// limits as in http.
func TestStreamContract(t *testing.T) {
	requireStreamLua(t)
	t.Parallel()
	srv := ownServer(t)
	c := streamConf(1)
	c.QServer = srv
	n := startNginx(t, c)
	p := n.streamPort

	want := map[string]string{
		"unary echo hello": "OK 0 hello",
		"unary fail x":     "OK 7 failed on purpose",
		"timeout":          "ERR timeout",
		"event k-stream":   "OK sent",
		"closed":           "ERR closed / nil closed",
		"stats":            "OK subsystem=stream host=builtin loaded=true calls=true",
		"peers":            "OK 1 up",
		"kill k":           "OK killed k",
		"timer tm":         "OK OK 0 tm",
		// the testing echo's shared command table (qstream.lua)
		"techo": "OK wrong=0 idle=true refused=bad argument #1: body must be a string",
	}
	for line, w := range want {
		if got := streamAsk(t, p, line); got != w {
			t.Errorf("stream %q: %q, want %q", line, got, w)
		}
	}
	if err := eventually(10*time.Second, func() error {
		if srv.eventCount("k-stream") != 1 {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Errorf("event k-stream counted %d times, want 1", srv.eventCount("k-stream"))
	}

	// qrpc.proto: a schema loaded and used in each VM
	if err := os.WriteFile(filepath.Join(n.dir, "qstream.proto"),
		[]byte("syntax = \"proto3\";\npackage qs;\nmessage Msg { string name = 1; int32 n = 2; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := streamAsk(t, p, "proto"); got != "OK 0 stream 7" {
		t.Errorf("stream proto: %q", got)
	}
	if got := httpAsk(t, n, "proto"); got != "OK 0 http 7" {
		t.Errorf("http proto: %q", got)
	}

	// The same misuse answers the same errors in both subsystems.
	for _, line := range []string{"badargs", "unary nope x", "closed", "timeout"} {
		s, h := streamAsk(t, p, line), httpAsk(t, n, line)
		if line == "badargs" {
			t.Logf("badargs in both: %s", s)
		}
		if s != h || strings.Contains(s, "raised") {
			t.Errorf("%q: stream %q, http %q", line, s, h)
		}
	}
	if got, w := httpAsk(t, n, "stats"), "OK subsystem=http host="+ng.Host(); !strings.HasPrefix(got, w) {
		t.Errorf("http stats: %q, want %q...", got, w)
	}

	// this VM's completions are a series of the worker's metrics
	for _, ask := range []struct {
		sub string
		f   func(string) string
	}{{"stream", func(l string) string { return streamAsk(t, p, l) }}, {"http", func(l string) string { return httpAsk(t, n, l) }}} {
		got := ask.f("metrics")
		if f := strings.Fields(got); len(f) != 3 || f[0] != "OK" || f[1] != "true" || f[2] == "none" || f[2] == "0" {
			t.Errorf("%s metrics: %q, want OK true <completions of the %s VM>", ask.sub, got, ask.sub)
		}
	}

	// preread_by_lua yields for its call
	if got := streamAsk(t, n.streamPort2, "preread"); !strings.HasPrefix(got, "OK OK 0 preread-") {
		t.Errorf("preread: %q", got)
	}

	// log_by_lua: the session above ended, its log phase sent an event and
	// was refused a unary (it yields)
	wantLog := "OK event=true unary=qrpc: unary cannot be used in the stream log phase (it yields); use conn:event, or a timer" +
		" connect=qrpc: cannot connect in the stream log phase (connect yields); connect in preread, content or a timer first, later calls reuse that connection"
	if err := eventually(10*time.Second, func() error {
		if got := streamAsk(t, p, "lastlog"); got != wantLog {
			return fmt.Errorf("lastlog: %q, want %q", got, wantLog)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if srv.eventCount("log-stream") < 1 {
		t.Errorf("no event from the stream log phase")
	}
	if c := n.logCount(`qrpc: loaded .*\(host builtin\) for the stream subsystem`); c != 1 {
		t.Errorf("%d 'loaded ... for the stream subsystem' lines, want 1", c)
	}
}

// mixResult counts the answers of a load round.
type mixResult struct {
	ok, lost, crossed atomic.Int64
	firstErr          atomic.Value
}

func (m *mixResult) check(want, got string, err error) {
	switch {
	case err == nil && got == want:
		m.ok.Add(1)
	case err == nil && strings.HasPrefix(got, "OK 0 ") && (strings.Contains(got, "http-") || strings.Contains(got, "stream-")):
		m.crossed.Add(1)
		m.firstErr.CompareAndSwap(nil, fmt.Sprintf("crossed: got %q, want %q", got, want))
	default:
		m.lost.Add(1)
		m.firstErr.CompareAndSwap(nil, fmt.Sprintf("lost: %q: got %q, err %v", want, got, err))
	}
}

func (m *mixResult) String() string {
	e, _ := m.firstErr.Load().(string)
	return fmt.Sprintf("ok=%d lost=%d crossed=%d %s", m.ok.Load(), m.lost.Load(), m.crossed.Load(), e)
}

// mixRound runs calls concurrent http requests and calls concurrent stream
// connections, each asking for a body that names it (round r), plus a
// killed light thread in each subsystem and calls the server holds for
// 300 ms (in flight across a reload); every request ends within timeout.
func mixRound(n *nginxProc, r, calls int, timeout time.Duration, m *mixResult) {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	viaHTTP := func(line string) (string, error) {
		resp, err := client.Get(n.url("/line?l=" + url.QueryEscape(line)))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return strings.TrimSuffix(string(b), "\n"), err
	}
	viaStream := func(line string) (string, error) {
		l, err := dialLines(n.streamPort, timeout)
		if err != nil {
			return "", err
		}
		defer l.close()
		return l.ask(line, timeout)
	}
	ask := func(subsystem string, i int, send func(string) (string, error)) {
		body := fmt.Sprintf("%s-%d-%d", subsystem, r, i)
		line, want := "unary echo "+body, "OK 0 "+body
		switch {
		case i == 0:
			line, want = "kill "+body, "OK killed "+body
		case i%20 == 1:
			line = "slowecho " + body
		}
		got, err := send(line)
		m.check(want, got, err)
	}
	var wg sync.WaitGroup
	for i := 0; i < calls; i++ {
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			ask("http", i, viaHTTP)
		}(i)
		go func(i int) {
			defer wg.Done()
			ask("stream", i, viaStream)
		}(i)
	}
	wg.Wait()
}

// TestStreamAndHTTPTogether: both subsystems' Lua VMs in each worker call
// at once; each VM gets exactly its own completions (0 lost, 0 crossed),
// with 1 and 2 workers, and across two reloads under load.
func TestStreamAndHTTPTogether(t *testing.T) {
	requireStreamLua(t)
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			n := startNginx(t, streamConf(workers))
			// Warm both VMs in every worker, then measure a round: the
			// bound of each later request comes from it.
			warm := &mixResult{}
			mixRound(n, 0, 20, 30*time.Second, warm)
			start := time.Now()
			base := &mixResult{}
			mixRound(n, 1, 200, 60*time.Second, base)
			took := time.Since(start)
			t.Logf("warm-up %s; a round of 200 http + 200 stream calls took %s: %s", warm, took, base)
			if base.lost.Load() != 0 || base.crossed.Load() != 0 || base.ok.Load() != 400 {
				t.Fatalf("round: %s", base)
			}
			timeout := max(20*took, 5*time.Second)

			// Two reloads while rounds run: calls in flight in the old
			// workers finish in both VMs.
			m := &mixResult{}
			stop := make(chan struct{})
			var rounds atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				for r := 2; r < 1000; r++ {
					select {
					case <-stop:
						return
					default:
					}
					mixRound(n, r, 200, timeout, m)
					rounds.Add(1)
				}
			}()
			for i := 0; i < 2; i++ {
				// a round of the mix done since the start (or the last reload)
				r0 := rounds.Load()
				if !testwait.For(timeout+10*took, func() bool { return rounds.Load() > r0 }) {
					t.Fatalf("reload %d: no round of calls done in %v", i+1, timeout+10*took)
				}
				old := n.workerPIDs()
				n.signal("reload")
				// the new workers are up when the old ones are gone
				testwait.For(timeout+10*took, func() bool {
					for _, p := range old {
						if pidAlive(p) {
							return false
						}
					}
					return true
				})
				for _, p := range old {
					if pidAlive(p) {
						t.Errorf("reload %d: old worker %d still alive after %s: %s", i+1, p, timeout+10*took, procState(p))
					}
				}
			}
			close(stop)
			select {
			case <-done:
			case <-time.After(10 * timeout):
				t.Fatalf("load rounds did not end within %s", 10*timeout)
			}
			t.Logf("%d rounds under 2 reloads: %s", rounds.Load(), m)
			if m.lost.Load() != 0 || m.crossed.Load() != 0 || m.ok.Load() == 0 {
				t.Errorf("under reload: %s", m)
			}
			if c := n.logCount(`waiting for \d+ call\(s\) in flight`); c > 0 {
				t.Logf("%d 'waiting for calls' lines while workers exited", c)
			}
		})
	}
}

// TestStreamWithRestyFFIHTTP: the http VM on the lua-resty-ffi host (the
// stand-in of testdata/fake_resty_ffi.*, which installs ngx.load_ffi),
// the stream VM on the built-in host by itself, even with an
// ngx.load_ffi in its own VM too; both at once, each its own answers.
func TestStreamWithRestyFFIHTTP(t *testing.T) {
	requireStreamLua(t)
	if shimPath == "" {
		t.Skipf("lua-resty-ffi stand-in unavailable: %v", shimErr)
	}
	t.Parallel()
	c := streamConf(1)
	c.InitByLua = `
        local qt = require "qtest"
        require("fake_resty_ffi").install(qt.shim)
        assert(require("resty.ffi.qrpc").configure{ lib = qt.lib, socket_dir = qt.dir .. "/run" })`
	c.StreamInitByLua = `
        local qt = require "qtest"
        require("fake_resty_ffi").install(qt.shim)
        local qrpc = require "resty.ffi.qrpc"
        local ok, err = qrpc.configure{ host = "resty_ffi" }
        assert(not ok and err:find("stream", 1, true), "configure host resty_ffi in stream: " .. tostring(err))
        assert(qrpc.configure{ lib = qt.lib, socket_dir = qt.dir .. "/run" })`
	n := startNginx(t, c)
	if got := httpAsk(t, n, "stats"); !strings.HasPrefix(got, "OK subsystem=http host=resty_ffi") {
		t.Errorf("http stats: %q", got)
	}
	if got := streamAsk(t, n.streamPort, "stats"); !strings.HasPrefix(got, "OK subsystem=stream host=builtin") {
		t.Errorf("stream stats: %q", got)
	}
	m := &mixResult{}
	mixRound(n, 1, 100, 60*time.Second, m)
	t.Logf("100 http (resty_ffi) + 100 stream (builtin) calls: %s", m)
	if m.lost.Load() != 0 || m.crossed.Load() != 0 || m.ok.Load() != 200 {
		t.Errorf("%s", m)
	}
}

// workerRSS is the VmRSS of pid in KiB.
func workerRSS(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}

// TestStreamAndHTTPMemory: many calls split across both VMs of one
// worker; its RSS stays flat once warm.
func TestStreamAndHTTPMemory(t *testing.T) {
	requireStreamLua(t)
	t.Parallel()
	n := startNginx(t, streamConf(1))
	pids := n.workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("workers %v", pids)
	}
	// 8 rounds of 12,500 calls: 100,000 in all, half in each VM
	const conns, perConn = 25, 250
	round := func(r int) (lost int64) {
		var bad atomic.Int64
		var wg sync.WaitGroup
		client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conns}}
		defer client.CloseIdleConnections()
		for c := 0; c < conns; c++ {
			wg.Add(2)
			go func(c int) {
				defer wg.Done()
				l, err := dialLines(n.streamPort, 10*time.Second)
				if err != nil {
					bad.Add(perConn)
					return
				}
				defer l.close()
				for i := 0; i < perConn; i++ {
					body := fmt.Sprintf("stream-%d-%d-%d", r, c, i)
					if got, err := l.ask("unary echo "+body, 60*time.Second); err != nil || got != "OK 0 "+body {
						bad.Add(1)
					}
				}
			}(c)
			go func(c int) {
				defer wg.Done()
				for i := 0; i < perConn; i++ {
					body := fmt.Sprintf("http-%d-%d-%d", r, c, i)
					resp, err := client.Get(n.url("/line?l=" + url.QueryEscape("unary echo "+body)))
					if err != nil {
						bad.Add(1)
						continue
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if string(b) != "OK 0 "+body+"\n" {
						bad.Add(1)
					}
				}
			}(c)
		}
		wg.Wait()
		return bad.Load()
	}
	const rounds = 8
	var rss []int
	var lost int64
	for r := 0; r < rounds; r++ {
		lost += round(r)
		rss = append(rss, workerRSS(t, pids[0]))
	}
	t.Logf("%d calls in each VM; worker RSS after each round (KiB): %v; lost %d", rounds*conns*perConn, rss, lost)
	if lost != 0 {
		t.Errorf("%d calls lost", lost)
	}
	// Flat once warm (after round 2): growth over the last rounds stays
	// under a tenth of the warm RSS.
	if grew := rss[rounds-1] - rss[1]; grew > rss[1]/10 {
		t.Errorf("RSS grew %d KiB from round 2 to round %d (%v)", grew, rounds, rss)
	}
}

// TestStreamAndHTTPQuit: nginx -s quit with calls in flight in both Lua
// VMs of a worker: each VM's dispatcher keeps the worker until its own
// calls have answered, and every caller gets its answer.
func TestStreamAndHTTPQuit(t *testing.T) {
	requireStreamLua(t)
	t.Parallel()
	srv := ownServer(t)
	c := streamConf(1)
	c.QServer = srv
	n := startNginx(t, c)
	// warm both VMs (library loaded, connections dialled)
	if got := streamAsk(t, n.streamPort, "unary echo warm"); got != "OK 0 warm" {
		t.Fatalf("stream warm-up: %q", got)
	}
	if got := httpAsk(t, n, "unary echo warm"); got != "OK 0 warm" {
		t.Fatalf("http warm-up: %q", got)
	}
	const each = 20
	m := &mixResult{}
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := 0; i < each; i++ {
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			body := fmt.Sprintf("http-quit-%d", i)
			resp, err := client.Get(n.url("/line?l=" + url.QueryEscape("slowecho 2000 "+body)))
			got := ""
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				got, err = strings.TrimSuffix(string(b), "\n"), rerr
			}
			m.check("OK 0 "+body, got, err)
		}(i)
		go func(i int) {
			defer wg.Done()
			body := fmt.Sprintf("stream-quit-%d", i)
			l, err := dialLines(n.streamPort, 10*time.Second)
			got := ""
			if err == nil {
				got, err = l.ask("slowecho 2000 "+body, 60*time.Second)
				l.close()
			}
			m.check("OK 0 "+body, got, err)
		}(i)
	}
	// all 40 held by the server (2 s each), then quit
	if err := eventually(30*time.Second, func() error {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if srv.slow < 2*each {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("the calls did not all reach the server: %v", err)
	}
	start := time.Now()
	n.signal("quit")
	wg.Wait()
	if !n.waitExit(30 * time.Second) {
		t.Fatalf("nginx did not exit after quit")
	}
	t.Logf("quit with %d http and %d stream calls in flight: %s; nginx exited %s after the quit", each, each, m, time.Since(start))
	if m.ok.Load() != 2*each {
		t.Errorf("%s", m)
	}
}
