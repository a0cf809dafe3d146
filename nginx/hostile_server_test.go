package nginx

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// fdCount is the number of open fds of pid.
func fdCount(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// defaultMaxFrame is max_frame_size's default (docs/api.md).
const defaultMaxFrame = 16 << 20

// partialFrameServer answers every stream's first request with the
// header of a frame of length l (within max_frame_size) and then sends
// l-2 bytes of it: the frame never completes. The stream stays open.
func partialFrameServer(t *testing.T, l uint32) string {
	return rawQUICServer(t, func(st *quic.Stream) {
		hdr := binary.BigEndian.AppendUint32(nil, l)
		hdr = append(hdr, 2) // RESPONSE
		if _, err := st.Write(hdr); err != nil {
			return
		}
		chunk := make([]byte, 256<<10)
		left := int(l) - 2
		for left > 0 {
			n := min(left, len(chunk))
			if _, err := st.Write(chunk[:n]); err != nil {
				return
			}
			left -= n
		}
		<-st.Context().Done()
	})
}

// TestPartialFramesReleasedAfterTimeout: a server that, for every call,
// starts a response frame just under max_frame_size and never finishes
// it. The calls time out ("timeout"); the streams holding the partial
// frames are retired then, so the worker's RSS comes back instead of
// keeping streams × max_frame_size for the connection's life.
func TestPartialFramesReleasedAfterTimeout(t *testing.T) {
	requireNginx(t)
	const frameLen = defaultMaxFrame - 64
	hostile := partialFrameServer(t, frameLen)
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", fmt.Sprintf(`
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qrpc.connect(%q, qt.opts({ stream_batch = tonumber(ngx.var.arg_batch), streams = tonumber(ngx.var.arg_streams) }))
                if not conn then ngx.say("connect: ", err) return end
                local n = tonumber(ngx.var.arg_n)
                if ngx.var.arg_seq then
                    local seen = {}
                    for i = 1, n do
                        local res, err = conn:unary("echo", "x", { timeout = 300 })
                        local r = res and "ok" or err
                        seen[r] = (seen[r] or 0) + 1
                    end
                    for k, v in pairs(seen) do ngx.say(k, " ", v) end
                    return
                end
                local ths = {}
                for i = 1, n do
                    ths[i] = ngx.thread.spawn(function()
                        local res, err = conn:unary("echo", "x", { timeout = 3000 })
                        return res and "ok" or err
                    end)
                end
                local seen = {}
                for i = 1, n do
                    local _, r = ngx.thread.wait(ths[i])
                    seen[r] = (seen[r] or 0) + 1
                end
                for k, v in pairs(seen) do ngx.say(k, " ", v) end`, hostile)) +
		loc("/ok", connectT+`
                local res, err = conn:unary("echo", "still here")
                ngx.say(res and res.body or err)`)})
	pid := n.workerPIDs()[0]
	if st, body := n.get("/ok"); st != 200 || body != "still here\n" {
		t.Fatalf("warm-up: %d %q", st, body)
	}
	rss0, fd0 := workerRSS(t, pid), fdCount(pid)
	st, body := n.get("/t?n=32&streams=32&batch=1")
	t.Logf("calls: %d %q", st, body)
	// Let the server push what flow control lets through; every call has
	// ended by now, nothing waits on the connection.
	time.Sleep(5 * time.Second)
	rss1, fd1 := workerRSS(t, pid), fdCount(pid)
	t.Logf("worker %d: RSS %d -> %d KiB (+%d MiB), fds %d -> %d", pid, rss0, rss1, (rss1-rss0)>>10, fd0, fd1)
	if !pidAlive(pid) {
		t.Fatalf("worker died")
	}
	if st, body := n.get("/ok"); st != 200 || body != "still here\n" {
		t.Errorf("after: %d %q", st, body)
	}
	if !strings.Contains(body, "timeout 32") {
		t.Errorf("calls: %q, want 32 timeouts", body)
	}
	// What may stay: a partial frame still arriving on a new stream and
	// one whose pages are not given back yet, each under max_frame_size.
	if grew := (rss1 - rss0) << 10; grew > 2*defaultMaxFrame {
		t.Errorf("worker RSS grew by %d MiB and stays there after every call ended (32 partial frames of %d bytes held)", grew>>20, frameLen)
	}
}

// statsLoc reports qrpc.stats() connections and pools.
const statsLoc = `
                local qrpc = require "resty.ffi.qrpc"
                collectgarbage()
                local s = qrpc.stats()
                ngx.say("connections=", s.connections, " pools=", s.pools, " inflight=", s.inflight, " waiting=", s.waiting,
                        " lua_kb=", math.floor(collectgarbage("count")))`

// TestConnCacheDistinctOptionsBounded: a caller that makes each connect
// distinct (here the timeout varies per request, as code computing a
// timeout from a request's budget would). max_connections (256) must cap
// the QUIC connections; the worker's RSS and fds must stay bounded.
func TestConnCacheDistinctOptionsBounded(t *testing.T) {
	ngxtest.Long(t, "2000 connects with distinct options, 27 s")
	requireNginx(t)
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local from, to = tonumber(ngx.var.arg_from), tonumber(ngx.var.arg_to)
                local errs = {}
                local t0 = ngx.now()
                for i = from, to do
                    local conn, err = qrpc.connect(qt.addr, qt.opts({ timeout = 1000 + i }))
                    if conn then
                        local res, e = conn:unary("echo", "x")
                        err = not res and e or nil
                    end
                    if err then errs[err] = (errs[err] or 0) + 1 end
                    if ngx.now() - t0 > 20 then ngx.say("stopped at ", i) break end
                end
                for k, v in pairs(errs) do ngx.say(k, " ", v) end
                ngx.say("done")`) + loc("/qstats", statsLoc) + loc("/heap", `
                local p, err = require("resty.ffi.qrpc").debug_profile(ngx.var.arg_kind or "heap")
                if not p then ngx.status = 500 ngx.say(err) return end
                ngx.print(p)`)})
	pid := n.workerPIDs()[0]
	n.get("/t?from=1&to=10")
	rss0, fd0 := workerRSS(t, pid), fdCount(pid)
	_, s0 := n.get("/qstats")
	t.Logf("warm: RSS %d KiB fds %d %s", rss0, fd0, s0)
	for r := 0; r < 4; r++ {
		start := time.Now()
		st, body := n.get(fmt.Sprintf("/t?from=%d&to=%d", 100+r*500, 100+r*500+499))
		_, s := n.get("/qstats")
		t.Logf("round %d (%s): %d %q RSS %d KiB fds %d %s", r, time.Since(start).Round(time.Millisecond), st, body, workerRSS(t, pid), fdCount(pid), s)
	}
	time.Sleep(10 * time.Second)
	rss1, fd1 := workerRSS(t, pid), fdCount(pid)
	_, s1 := n.get("/qstats")
	t.Logf("10 s later: RSS %d KiB fds %d %s", rss1, fd1, s1)
	if dir := os.Getenv("QRPC_TEST_PROF"); dir != "" {
		for _, k := range []string{"heap", "goroutine"} {
			_, p := n.get("/heap?kind=" + k)
			_ = os.WriteFile(dir+"/"+k+".pb.gz", []byte(p), 0o644)
		}
	}
	if !pidAlive(pid) {
		t.Fatal("worker died")
	}
	// max_connections (256, docs/api.md) caps the connections, one UDP
	// socket each.
	const maxConnections = 256
	if fd1-fd0 > maxConnections {
		t.Errorf("fds %d -> %d, over max_connections (%d)", fd0, fd1, maxConnections)
	}
	// About 2.6 MB of RSS per idle connection (docs/tuning.md): logged.
	t.Logf("RSS %d -> %d KiB", rss0, rss1)
}

// TestRefusedAddrsLeaveNothing: connects to many distinct addresses
// where nothing listens ("connect: refused"). Nothing should stay behind:
// no connection, no fd, bounded memory.
func TestRefusedAddrsLeaveNothing(t *testing.T) {
	ngxtest.Long(t, "connects to many refused addresses, 11 s")
	requireNginx(t)
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local from, to = tonumber(ngx.var.arg_from), tonumber(ngx.var.arg_to)
                local errs = {}
                local t0 = ngx.now()
                for i = from, to do
                    local conn, err = qrpc.connect("127.0.0.1:" .. i, qt.opts({ timeout = 300 }))
                    if conn then err = "connected" end
                    errs[err] = (errs[err] or 0) + 1
                    if ngx.now() - t0 > 20 then ngx.say("stopped at ", i) break end
                end
                for k, v in pairs(errs) do ngx.say(k, " ", v) end
                ngx.say("done")`) + loc("/qstats", statsLoc)})
	pid := n.workerPIDs()[0]
	n.get("/t?from=40001&to=40010")
	rss0, fd0 := workerRSS(t, pid), fdCount(pid)
	for r := 0; r < 4; r++ {
		start := time.Now()
		from := 41000 + r*50
		st, body := n.get(fmt.Sprintf("/t?from=%d&to=%d", from, from+49))
		_, s := n.get("/qstats")
		t.Logf("round %d (%s): %d %q RSS %d KiB fds %d %s", r, time.Since(start).Round(time.Millisecond), st, body, workerRSS(t, pid), fdCount(pid), s)
	}
	rss1, fd1 := workerRSS(t, pid), fdCount(pid)
	if !pidAlive(pid) {
		t.Fatal("worker died")
	}
	if fd1-fd0 > 20 {
		t.Errorf("fds %d -> %d", fd0, fd1)
	}
	if (rss1-rss0)>>10 > 64 {
		t.Errorf("RSS %d -> %d KiB", rss0, rss1)
	}
}

// callLoopLoc runs n calls (k at a time) against addr and counts the
// outcomes; with kill set, each call's thread is killed after a few ms.
const callLoopLoc = `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local addr = ngx.var.arg_addr
                local conn, err = qrpc.connect(addr, qt.opts({ timeout = 2000 }))
                if not conn then ngx.say("connect: ", err) return end
                local n, k = tonumber(ngx.var.arg_n), tonumber(ngx.var.arg_k or 1)
                local kill = ngx.var.arg_kill
                local method, body = ngx.var.arg_m or "echo", ngx.var.arg_b or "x"
                if ngx.var.arg_blen then
                    local t = {}
                    for i = 1, tonumber(ngx.var.arg_blen) do t[i] = string.char(math.random(0, 255)) end
                    body = table.concat(t)
                end
                local seen = {}
                local t0 = ngx.now()
                local done = 0
                while done < n and ngx.now() - t0 < 40 do
                    local ths = {}
                    for i = 1, k do
                        ths[i] = ngx.thread.spawn(function()
                            local res, err = conn:unary(method, body)
                            return res and "ok" or err
                        end)
                    end
                    if kill then
                        ngx.sleep(tonumber(kill) / 1000)
                        for i = 1, k do
                            local ok = ngx.thread.kill(ths[i])
                            if ok then seen.killed = (seen.killed or 0) + 1 end
                        end
                    end
                    for i = 1, k do
                        local ok, r = ngx.thread.wait(ths[i])
                        if ok then seen[r] = (seen[r] or 0) + 1 end
                    end
                    done = done + k
                    ngx.update_time()
                end
                local keys = {}
                for key, v in pairs(seen) do keys[#keys + 1] = key .. "=" .. v end
                table.sort(keys)
                ngx.say(table.concat(keys, " "))`

func goroutineSummary(t *testing.T, n *nginxProc) string {
	st, p := n.get("/heap?kind=goroutine")
	if st != 200 {
		return fmt.Sprintf("profile: %d %q", st, p)
	}
	f, err := os.CreateTemp("", "qrpc-goroutines-*.pb.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	_, _ = f.WriteString(p)
	_ = f.Close()
	out, _ := exec.Command("go", "tool", "pprof", "-top", f.Name()).CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "Showing nodes") {
			return l
		}
	}
	return string(out)
}

// TestResetAndKillLoopsRecover: a server that resets every stream, one
// that closes every stream, and calls killed mid-flight, in loops. The
// worker must stay up, errors must be documented, and goroutines, fds
// and RSS must come back.
func TestResetAndKillLoopsRecover(t *testing.T) {
	requireNginx(t)
	reset := rawQUICServer(t, func(st *quic.Stream) { st.CancelWrite(7); st.CancelRead(7) })
	eof := rawQUICServer(t, func(st *quic.Stream) { _ = st.Close() })
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/loop", callLoopLoc) + loc("/qstats", statsLoc) + loc("/heap", `
                local p, err = require("resty.ffi.qrpc").debug_profile(ngx.var.arg_kind or "heap")
                if not p then ngx.status = 500 ngx.say(err) return end
                ngx.print(p)`)})
	pid := n.workerPIDs()[0]
	n.get("/loop?n=10&addr=" + shared.addr)
	report := func(what string) {
		_, s := n.get("/qstats")
		t.Logf("%s: RSS %d KiB fds %d %s; goroutines %s", what, workerRSS(t, pid), fdCount(pid), strings.TrimSpace(s), goroutineSummary(t, n))
	}
	report("warm")
	for _, c := range []struct{ name, q string }{
		{"reset x2000", "n=2000&k=20&addr=" + reset},
		{"eof x2000", "n=2000&k=20&addr=" + eof},
		{"kill slow x2000", "n=2000&k=50&kill=5&m=slow&b=1000&addr=" + shared.addr},
		{"reset x2000 again", "n=2000&k=20&addr=" + reset},
		{"kill slow x2000 again", "n=2000&k=50&kill=5&m=slow&b=1000&addr=" + shared.addr},
	} {
		start := time.Now()
		st, body := n.get("/loop?" + c.q)
		t.Logf("%s (%s): %d %q", c.name, time.Since(start).Round(time.Millisecond), st, strings.TrimSpace(body))
		report(c.name)
	}
	time.Sleep(3 * time.Second)
	report("3 s later")
	if !pidAlive(pid) {
		t.Fatal("worker died")
	}
	if st, body := n.get("/loop?n=5&addr=" + shared.addr); st != 200 || strings.TrimSpace(body) != "ok=5" {
		t.Errorf("after: %d %q", st, body)
	}
}

// TestPartialFramesDefaultOptionsReleased: the same server, default
// connect options, one call at a time (each 300 ms timeout): every
// stream a call touches gets a partial frame, which must not stay pinned
// once its call has ended.
func TestPartialFramesDefaultOptionsReleased(t *testing.T) {
	ngxtest.Long(t, "64 partial answers of 16 MiB, 28 s")
	requireNginx(t)
	const frameLen = defaultMaxFrame - 64
	hostile := partialFrameServer(t, frameLen)
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", fmt.Sprintf(`
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qrpc.connect(%q, qt.opts())
                if not conn then ngx.say("connect: ", err) return end
                local seen = {}
                for i = 1, tonumber(ngx.var.arg_n) do
                    local res, err = conn:unary("echo", "x", { timeout = 300 })
                    local r = res and "ok" or err
                    seen[r] = (seen[r] or 0) + 1
                end
                for k, v in pairs(seen) do ngx.say(k, " ", v) end`, hostile)) + loc("/qstats", statsLoc)})
	pid := n.workerPIDs()[0]
	n.get("/qstats")
	rss0 := workerRSS(t, pid)
	for r := 0; r < 4; r++ {
		st, body := n.get("/t?n=16")
		time.Sleep(time.Second)
		_, s := n.get("/qstats")
		t.Logf("round %d: %d %q RSS %d KiB %s", r, st, strings.TrimSpace(body), workerRSS(t, pid), strings.TrimSpace(s))
	}
	time.Sleep(5 * time.Second)
	rss1 := workerRSS(t, pid)
	t.Logf("worker %d: RSS %d -> %d KiB (+%d MiB)", pid, rss0, rss1, (rss1-rss0)>>10)
	// As above: at most two frames' worth stays.
	if grew := (rss1 - rss0) << 10; grew > 2*defaultMaxFrame {
		t.Errorf("worker RSS grew by %d MiB after 64 timed-out calls, no call in flight", grew>>20)
	}
}

// TestNeverReadingServerQueueReleased: a server that takes the streams and
// never reads them; a caller floods it with calls carrying 60 KB bodies,
// which wait in the streams' send queues and time out. Their frames leave
// the queues when they time out: the next rounds reuse that memory rather
// than queue on top of it (a queue holds up to 16 MiB per stream, 512 MiB
// for the connection), and other calls keep working.
func TestNeverReadingServerQueueReleased(t *testing.T) {
	requireNginx(t)
	const calls, blen = 4000, 60000
	deaf := rawQUICServer(t, func(st *quic.Stream) { <-st.Context().Done() })
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/loop", callLoopLoc) + loc("/qstats", statsLoc)})
	pid := n.workerPIDs()[0]
	n.get("/loop?n=10&addr=" + shared.addr)
	var rss [3]int
	for r := range rss {
		start := time.Now()
		st, out := n.get(fmt.Sprintf("/loop?n=%d&k=%d&blen=%d&addr=%s", calls, calls, blen, deaf))
		_, s := n.get("/qstats")
		rss[r] = workerRSS(t, pid)
		t.Logf("round %d (%s): %d %q RSS %d KiB %s", r, time.Since(start).Round(time.Millisecond), st, strings.TrimSpace(out), rss[r], strings.TrimSpace(s))
		if strings.TrimSpace(out) != fmt.Sprintf("timeout=%d", calls) {
			t.Errorf("round %d: %q, want every call to time out", r, out)
		}
	}
	if st, out := n.get("/loop?n=5&addr=" + shared.addr); st != 200 || strings.TrimSpace(out) != "ok=5" {
		t.Errorf("after: %d %q", st, out)
	}
	// One round queues calls*blen bytes; a queue that kept the frames of
	// the calls that timed out would add that much each round.
	if grew, round := rss[2]-rss[0], calls*blen>>10; grew > round/4 {
		t.Errorf("worker RSS grew by %d KiB over two more rounds of %d KiB of frames: the frames of calls that timed out stay queued for a server that never reads", grew, round)
	}
}

// hostileServer is a bare QUIC server (test certificate, ALPN qrpc) that
// reads every request frame of every stream and answers it with the
// bytes reply returns (a whole frame, written raw).
func hostileServer(t *testing.T, reply func(req *qrpcpb.Request) []byte) string {
	t.Helper()
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{serverTLSCert}, NextProtos: []string{qrpc.ALPN},
	}, &quic.Config{MaxIdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					st, err := c.AcceptStream(ctx)
					if err != nil {
						return
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							var hdr [5]byte
							if _, err := io.ReadFull(st, hdr[:]); err != nil {
								return
							}
							l := binary.BigEndian.Uint32(hdr[:4])
							p := make([]byte, l-1)
							if _, err := io.ReadFull(st, p); err != nil {
								return
							}
							var req qrpcpb.Request
							if err := req.UnmarshalVT(p); err != nil {
								return
							}
							if _, err := st.Write(reply(&req)); err != nil {
								return
							}
						}
					}()
				}
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// responseFrame frames a Response payload.
func responseFrame(p []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(p)+1))
	return append(append(b, 2), p...)
}

// manyHeadersResponse is a Response for id with n header entries: empty
// ones, or distinct short keys (and empty values).
func manyHeadersResponse(id uint64, n int, distinct bool) []byte {
	p := protowire.AppendTag(nil, 3, protowire.VarintType)
	p = protowire.AppendVarint(p, id)
	for i := 0; i < n; i++ {
		p = protowire.AppendTag(p, 1, protowire.BytesType)
		if distinct && i%2 == 0 {
			p = protowire.AppendBytes(p, strconv.AppendInt(nil, int64(i), 36))
		} else {
			p = protowire.AppendBytes(p, nil)
		}
	}
	return p
}

// TestResponseHeaderFloodRefused: a server answers with millions of
// header entries inside max_frame_size (16 MiB). Such an answer is over
// the documented limit (MaxResponseHeaderEntries, as for requests): the
// call fails with "connection lost: protocol error" before anything is
// built for Lua: the event loop is blocked for much less than building
// its header table would take in this worker (measured here), and the
// largest answer allowed is answered whole.
func TestResponseHeaderFloodRefused(t *testing.T) {
	requireNginx(t)
	const limit = qrpc.MaxResponseHeaderEntries
	srv := hostileServer(t, func(req *qrpcpb.Request) []byte {
		switch string(req.Method) {
		case "empty":
			return responseFrame(manyHeadersResponse(req.RequestId, 6<<20, false)) // 12 MB
		case "distinct":
			return responseFrame(manyHeadersResponse(req.RequestId, 3<<20, true)) // ~ 14 MB
		case "limit":
			return responseFrame(manyHeadersResponse(req.RequestId, limit, true))
		}
		p, _ := (&qrpcpb.Response{RequestId: req.RequestId, Body: req.Body}).MarshalVT()
		return responseFrame(p)
	})
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/h", fmt.Sprintf(`
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qrpc.connect(%q, qt.opts({ timeout = 20000 + tonumber(ngx.var.arg_c) }))
                if not conn then ngx.say("connect: ", err) return end
                local res, err = conn:unary(ngx.var.arg_m, "x")
                local cnt = 0
                if res then for _ in pairs(res.headers) do cnt = cnt + 1 end end
                ngx.say(res and ("ok keys=" .. cnt .. " body=" .. #res.body) or err)`, srv)) +
		loc("/loopcheck", `ngx.say("pong")`) + loc("/cost", `
                -- The header table an answer of n entries would give,
                -- built on this worker's event loop as abi.lua builds it
                -- (ffi.string per name and value): what a flood would
                -- block it for.
                local n, distinct = tonumber(ngx.var.arg_n), ngx.var.arg_distinct
                ngx.update_time()
                local t0 = ngx.now()
                local ffi = require "ffi"
                local buf = ffi.new("char[16]")
                local t = {}
                for i = 1, n, 2 do
                    local klen = 0
                    if distinct then
                        local k = string.format("%x", i)
                        ffi.copy(buf, k, #k)
                        klen = #k
                    end
                    t[ffi.string(buf, klen)] = ffi.string(buf, 0)
                end
                ngx.update_time()
                ngx.say(math.floor((ngx.now() - t0) * 1000))`)})
	cost := func(entries int) time.Duration {
		_, body := n.get(fmt.Sprintf("/cost?n=%d&distinct=1", entries))
		ms, err := strconv.Atoi(strings.TrimSpace(body))
		if err != nil {
			t.Fatalf("cost: %q", body)
		}
		return time.Duration(ms) * time.Millisecond
	}
	// worstStall is the longest /loopcheck took while the call ran; each
	// method has a connection of its own (a refused answer fails its
	// connection).
	conns := 0
	worstStall := func(m string) (string, time.Duration) {
		conns++
		stop := make(chan struct{})
		var worst time.Duration
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				s := time.Now()
				n.get("/loopcheck")
				worst = max(worst, time.Since(s))
			}
		}()
		st, body := n.get(fmt.Sprintf("/h?m=%s&c=%d", m, conns))
		close(stop)
		wg.Wait()
		if st != 200 {
			t.Errorf("%s: HTTP %d %q", m, st, body)
		}
		return strings.TrimSpace(body), worst
	}
	// The largest answer allowed is answered whole.
	if body, _ := worstStall("limit"); body != fmt.Sprintf("ok keys=%d body=0", limit/2) {
		t.Fatalf("answer at the limit: %q, want %d keys", body, limit/2)
	}
	if body, _ := worstStall("empty"); body != "connection lost: protocol error" {
		t.Errorf("empty: %q, want connection lost: protocol error", body)
	}
	// Distinct names: the costliest table to build.
	body, worst := worstStall("distinct")
	table := cost(3 << 20)
	t.Logf("distinct: %q; worst /loopcheck %s; its table would take %s", body, worst.Round(time.Millisecond), table)
	if body != "connection lost: protocol error" {
		t.Errorf("distinct: %q, want connection lost: protocol error", body)
	}
	if worst > table/4 {
		t.Errorf("the event loop was blocked for up to %s by a refused answer, over a quarter of the %s its header table takes to build", worst.Round(time.Millisecond), table)
	}
}

// TestResponseHeadersNotPinnedPerStream: a stream's reader does not keep
// the header slice of a large answer for the next ones. Answers at the
// header limit (empty entries, 24 bytes of slice each) on every stream
// (stream_batch = 1), then small ones: the worker's memory must not keep
// one such slice per stream.
func TestResponseHeadersNotPinnedPerStream(t *testing.T) {
	requireNginx(t)
	const streams = 64
	srv := hostileServer(t, func(req *qrpcpb.Request) []byte {
		if string(req.Method) == "limit" {
			return responseFrame(manyHeadersResponse(req.RequestId, qrpc.MaxResponseHeaderEntries, false))
		}
		p, _ := (&qrpcpb.Response{RequestId: req.RequestId, Body: req.Body}).MarshalVT()
		return responseFrame(p)
	})
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/h", fmt.Sprintf(`
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qrpc.connect(%q, qt.opts({ timeout = 20000, stream_batch = 1, streams = %d }))
                if not conn then ngx.say("connect: ", err) return end
                local seen = {}
                for i = 1, tonumber(ngx.var.arg_n) do
                    local res, err = conn:unary(ngx.var.arg_m, "x")
                    local r = res and "ok" or err
                    seen[r] = (seen[r] or 0) + 1
                end
                for k, v in pairs(seen) do ngx.say(k, " ", v) end`, srv, streams))})
	pid := n.workerPIDs()[0]
	n.get(fmt.Sprintf("/h?m=echo&n=%d", streams))
	rss0 := workerRSS(t, pid)
	if st, body := n.get(fmt.Sprintf("/h?m=limit&n=%d", streams)); st != 200 || strings.TrimSpace(body) != fmt.Sprintf("ok %d", streams) {
		t.Fatalf("answers at the header limit: %d %q", st, body)
	}
	// Small answers on every stream afterwards: a kept slice is not replaced.
	n.get(fmt.Sprintf("/h?m=echo&n=%d", 2*streams))
	time.Sleep(2 * time.Second)
	rss1 := workerRSS(t, pid)
	pinned := streams * 24 * qrpc.MaxResponseHeaderEntries >> 10 // KiB, one slice per stream
	t.Logf("RSS %d -> %d KiB (+%d KiB); one slice per stream would be %d KiB", rss0, rss1, rss1-rss0, pinned)
	if rss1-rss0 > pinned/2 {
		t.Errorf("worker RSS stays %d KiB higher after %d answers of %d header entries, every call ended (a slice per stream is %d KiB)",
			rss1-rss0, streams, qrpc.MaxResponseHeaderEntries, pinned)
	}
}

// heldListener starts a QUIC listener with tlsConf and quicConf whose
// connections are held (never served) until the test ends.
func heldListener(t *testing.T, tlsConf *tls.Config, quicConf *quic.Config) string {
	t.Helper()
	ln, err := quic.ListenAddr("127.0.0.1:0", tlsConf, quicConf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := ln.Accept(ctx); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// TestConnectTimeoutStuckHandshakeNoStreams: a server whose TLS handshake
// never finishes, and one that completes it but grants no streams. The
// connect must end within its timeout with a documented error.
func TestConnectTimeoutStuckHandshakeNoStreams(t *testing.T) {
	requireNginx(t)
	release := make(chan struct{})
	stuckTLS := heldListener(t, &tls.Config{
		NextProtos: []string{qrpc.ALPN},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
			return nil, fmt.Errorf("no")
		},
		Certificates: []tls.Certificate{serverTLSCert},
	}, &quic.Config{MaxIdleTimeout: 30 * time.Second})
	noStreams := heldListener(t, &tls.Config{
		Certificates: []tls.Certificate{serverTLSCert}, NextProtos: []string{qrpc.ALPN},
	}, &quic.Config{MaxIdleTimeout: 30 * time.Second, MaxIncomingStreams: -1})
	t.Cleanup(func() { close(release) }) // runs before the listeners' cleanups
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/c", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local t0 = ngx.now()
                local conn, err, info = qrpc.connect(ngx.var.arg_addr, qt.opts({ timeout = 1000 }))
                local res
                if conn then
                    res, err, info = conn:unary("echo", "x", { timeout = 1000 })
                end
                ngx.update_time()
                ngx.say(conn and "connected; " or "", res and "ok" or err, " (", info and info.detail or "", ") took=", ngx.now() - t0)`)})
	for _, c := range []struct{ name, addr string }{{"tls never done", stuckTLS}, {"no streams granted", noStreams}} {
		start := time.Now()
		st, body := n.get("/c?addr=" + c.addr)
		took := time.Since(start)
		t.Logf("%s: %d %q in %s", c.name, st, strings.TrimSpace(body), took.Round(time.Millisecond))
		if took > 3*time.Second {
			t.Errorf("%s: took %s with timeout 1000 ms", c.name, took)
		}
	}
}

// TestDuplicateUnknownLateAnswers: answers duplicated, answers with unknown
// ids in bulk, answers after the call's timeout. Calls get their own
// answer or "timeout", the worker's memory stays flat.
func TestDuplicateUnknownLateAnswers(t *testing.T) {
	requireNginx(t)
	srv := hostileServer(t, func(req *qrpcpb.Request) []byte {
		ok := func(id uint64) []byte {
			p, _ := (&qrpcpb.Response{RequestId: id, Body: req.Body}).MarshalVT()
			return responseFrame(p)
		}
		switch string(req.Method) {
		case "dup":
			var b []byte
			for i := 0; i < 2000; i++ {
				b = append(b, ok(req.RequestId^uint64(i+1)*0x9e3779b97f4a7c15)...)
			}
			return append(append(b, ok(req.RequestId)...), ok(req.RequestId)...)
		case "late":
			time.Sleep(300 * time.Millisecond)
			return ok(req.RequestId)
		}
		return ok(req.RequestId)
	})
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/loop", callLoopLoc) + loc("/late", fmt.Sprintf(`
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect(%q, qt.opts()))
                local seen = {}
                for i = 1, 20 do
                    local res, err = conn:unary("late", "l" .. i, { timeout = 100 })
                    local r = res and (res.body == "l" .. i and "ok" or "crossed") or err
                    seen[r] = (seen[r] or 0) + 1
                    local res, err = conn:unary("echo", "e" .. i, { timeout = 2000 })
                    r = res and (res.body == "e" .. i and "ok" or "crossed:" .. res.body) or err
                    seen[r] = (seen[r] or 0) + 1
                end
                local keys = {}
                for k, v in pairs(seen) do keys[#keys + 1] = k .. "=" .. v end
                table.sort(keys)
                ngx.say(table.concat(keys, " "))`, srv))})
	pid := n.workerPIDs()[0]
	n.get("/loop?n=10&addr=" + srv)
	rss0 := workerRSS(t, pid)
	st, body := n.get("/loop?n=400&k=20&m=dup&addr=" + srv)
	t.Logf("dup+unknown: %d %q RSS %d KiB", st, strings.TrimSpace(body), workerRSS(t, pid))
	st, body = n.get("/late")
	t.Logf("late: %d %q RSS %d -> %d KiB", st, strings.TrimSpace(body), rss0, workerRSS(t, pid))
	if strings.Contains(body, "crossed") {
		t.Errorf("a call got another call's answer: %q", body)
	}
}

// TestConcurrencyFloodRecovers: tens of thousands of calls at once from one
// worker, against the shared server's slow method: each ends with an
// answer or a documented error, the worker comes back to its memory.
func TestConcurrencyFloodRecovers(t *testing.T) {
	ngxtest.Long(t, "two rounds of 20,000 calls at once")
	requireNginx(t)
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/loop", callLoopLoc) + loc("/qstats", statsLoc)})
	pid := n.workerPIDs()[0]
	n.get("/loop?n=10&addr=" + shared.addr)
	rss0, fd0 := workerRSS(t, pid), fdCount(pid)
	k := os.Getenv("QRPC_TEST_K")
	if k == "" {
		k = "20000"
	}
	for r := 0; r < 2; r++ {
		start := time.Now()
		st, body := n.get("/loop?n=" + k + "&k=" + k + "&m=slow&b=200&addr=" + shared.addr)
		_, s := n.get("/qstats")
		t.Logf("round %d (%s): %d %q RSS %d KiB fds %d %s", r, time.Since(start).Round(time.Millisecond), st, strings.TrimSpace(body), workerRSS(t, pid), fdCount(pid), strings.TrimSpace(s))
	}
	time.Sleep(6 * time.Second)
	t.Logf("6 s later: RSS %d -> %d KiB, fds %d -> %d", rss0, workerRSS(t, pid), fd0, fdCount(pid))
	if st, out := n.get("/loop?n=5&addr=" + shared.addr); st != 200 || strings.TrimSpace(out) != "ok=5" {
		t.Errorf("after: %d %q", st, out)
	}
}

// TestOddResponseHeadersAnswered: an answer whose flat header list has an
// odd number of entries (a name without a value) is answered without the
// dangling name, and a code over 2^31 comes through whole.
func TestOddResponseHeadersAnswered(t *testing.T) {
	requireNginx(t)
	srv := hostileServer(t, func(req *qrpcpb.Request) []byte {
		r := &qrpcpb.Response{RequestId: req.RequestId, Body: req.Body}
		switch string(req.Method) {
		case "odd":
			r.Headers = [][]byte{[]byte("a"), []byte("1"), []byte("dangling")}
		case "code":
			r.Code = 0xfffffffe
		}
		p, _ := r.MarshalVT()
		return responseFrame(p)
	})
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/h", fmt.Sprintf(`
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect(%q, qt.opts()))
                local res, err, info = conn:unary(ngx.var.arg_m, "x")
                if not res then ngx.say("err ", err, " ", info and info.detail or "") return end
                local hs = {}
                for k, v in pairs(res.headers) do hs[#hs + 1] = k .. "=" .. v end
                table.sort(hs)
                ngx.say("code=", res.code, " headers=", table.concat(hs, ","))`, srv))})
	for _, c := range []struct{ m, want string }{
		{"odd", "code=0 headers=a=1"},
		{"code", "code=4294967294 headers="},
	} {
		st, body := n.get("/h?m=" + c.m)
		if st != 200 || strings.TrimSpace(body) != c.want {
			t.Errorf("%s: %d %q, want %q", c.m, st, strings.TrimSpace(body), c.want)
		}
	}
}

// TestGatewayResponseHeaderFloodBounded: the gateway writes a server's
// answer headers into the HTTP response (response_headers patterns).
// Each ngx.header assignment searches those set before it, so a server
// answering with many matching headers (within the qrpc limit) would
// block the event loop for N^2: the gateway forwards at most
// MAX_FORWARDED (100) and answers 502 beyond. The item id of the request
// says how many x- headers the server sends.
func TestGatewayResponseHeaderFloodBounded(t *testing.T) {
	requireNginx(t)
	dir := gatewayDir(t)
	const maxForwarded = 100 // gateway/response.lua MAX_FORWARDED, docs/gateway.md
	flood := 20000
	if v, err := strconv.Atoi(os.Getenv("QRPC_TEST_NH")); err == nil {
		flood = v
	}
	srv := hostileServer(t, func(req *qrpcpb.Request) []byte {
		nh := 0
		if _, _, l := protowire.ConsumeTag(req.Body); l > 0 {
			if v, m := protowire.ConsumeBytes(req.Body[l:]); m > 0 {
				nh, _ = strconv.Atoi(string(v))
			}
		}
		r := &qrpcpb.Response{RequestId: req.RequestId, Body: []byte{}}
		for i := 0; i < nh; i++ {
			r.Headers = append(r.Headers, []byte("x-h"+strconv.Itoa(i)), []byte("v"))
		}
		r.Headers = append(r.Headers, []byte("y-other"), []byte("not forwarded"))
		p, _ := r.MarshalVT()
		return responseFrame(p)
	})
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        package.loaded.gw_h = assert(gateway.new{`,
			`            upstream = qt.hostile, opts = qt.opts({ timeout = 20000 }),`,
			`            protos = { files = { "shop.proto" }, import_paths = { "`+dir+`" } }, prefix = "/api",`,
			`            response_headers = { "x-*" },`,
			`            routes = { ["GET /v1/items/{id}"] = { method = "gwtest.Shop.GetItem" } },`,
			`        })`),
		Extra: map[string]string{"hostile": srv},
		Server: loc("/loopcheck", `ngx.say("pong")`) + loc("/cost", `
                -- What forwarding n headers one by one costs this worker.
                ngx.update_time()
                local t0 = ngx.now()
                for i = 1, tonumber(ngx.var.arg_n) do ngx.header["x-h" .. i] = "v" end
                ngx.update_time()
                local took = math.floor((ngx.now() - t0) * 1000)
                for i = 1, tonumber(ngx.var.arg_n) do ngx.header["x-h" .. i] = nil end
                ngx.say(took)`) +
			"        location /api/ {\n            content_by_lua_block { package.loaded.gw_h:serve() }\n        }\n",
	})
	// At the limit: every matching header is forwarded.
	r := n.req(t, "GET", fmt.Sprintf("/api/v1/items/%d", maxForwarded), "")
	got := 0
	for k := range r.hdr {
		if strings.HasPrefix(k, "X-H") {
			got++
		}
	}
	if r.status != 200 || got != maxForwarded || r.hdr.Get("Y-Other") != "" {
		t.Errorf("%d headers: HTTP %d with %d x- headers (y-other %q), want 200 with all", maxForwarded, r.status, got, r.hdr.Get("Y-Other"))
	}
	// Over it: a 502, whatever the number.
	r = n.req(t, "GET", fmt.Sprintf("/api/v1/items/%d", maxForwarded+1), "")
	if want := fmt.Sprintf(`{"code":13,"message":"too many response headers (%d; at most %d)","details":[]}`, maxForwarded+1, maxForwarded); r.status != 502 || strings.TrimSpace(r.body) != want {
		t.Errorf("%d headers: HTTP %d %q, want 502 %s", maxForwarded+1, r.status, r.body, want)
	}
	stop := make(chan struct{})
	var worst time.Duration
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() {
		defer pwg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			s := time.Now()
			n.get("/loopcheck")
			worst = max(worst, time.Since(s))
		}
	}()
	r = n.req(t, "GET", fmt.Sprintf("/api/v1/items/%d", flood), "")
	close(stop)
	pwg.Wait()
	_, body := n.get(fmt.Sprintf("/cost?n=%d", flood))
	ms, err := strconv.Atoi(strings.TrimSpace(body))
	if err != nil {
		t.Fatalf("cost: %q", body)
	}
	cost := time.Duration(ms) * time.Millisecond
	t.Logf("%d headers: HTTP %d %q; worst /loopcheck %s; forwarding them one by one takes %s", flood, r.status, tail(r.body, 3), worst.Round(time.Millisecond), cost)
	if r.status != 502 {
		t.Errorf("%d headers: HTTP %d, want 502", flood, r.status)
	}
	if worst > cost/4 {
		t.Errorf("the event loop was blocked for up to %s by one answer of %d headers, over a quarter of the %s forwarding them takes", worst.Round(time.Millisecond), flood, cost)
	}
}
