package nginx

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// rawQUICServer accepts connections with the test certificate and hands
// each stream's first request to onStream.
func rawQUICServer(t *testing.T, onStream func(st *quic.Stream)) string {
	t.Helper()
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{serverTLSCert}, NextProtos: []string{qrpc.ALPN},
	}, &quic.Config{MaxIdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				for {
					st, err := c.AcceptStream(c.Context())
					if err != nil {
						return
					}
					go func() {
						var hdr [4]byte
						if _, err := io.ReadFull(st, hdr[:]); err != nil {
							return
						}
						l := int(hdr[0])<<24 | int(hdr[1])<<16 | int(hdr[2])<<8 | int(hdr[3])
						if _, err := io.CopyN(io.Discard, st, int64(l)); err != nil {
							return
						}
						onStream(st)
					}()
				}
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		<-done
	})
	return ln.Addr().String()
}

// TestErrorReasonsThroughNginx: every reason path gives its documented
// string to Lua.
func TestErrorReasonsThroughNginx(t *testing.T) {
	t.Parallel()
	requireNginx(t)
	dead := func() string {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		return pc.LocalAddr().String()
	}()
	// A port that is open but never answers (a frozen server).
	silentPC, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silentPC.Close() })
	silent := silentPC.LocalAddr().String()
	reset := rawQUICServer(t, func(st *quic.Stream) { st.CancelWrite(7) })
	eof := rawQUICServer(t, func(st *quic.Stream) { _ = st.Close() })
	garbage := rawQUICServer(t, func(st *quic.Stream) { _, _ = st.Write([]byte{0, 0, 0, 1, 99}) })

	// A server to shut down under a call in flight.
	closing := ownServer(t)
	// A server to kill (socket closed, no CONNECTION_CLOSE) and, for the
	// reset, bring back with the same key.
	killed := ownServer(t)

	call := func(addr, opts, method, body, copts string) string {
		return fmt.Sprintf(`
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn, err = qrpc.connect(%q, qt.opts(%s))
                if not conn then ngx.say(err) return end
                local res, err, info = conn:unary(%q, %q, %s)
                ngx.say(res and ("code " .. res.code) or err .. (info.detail and " (" .. info.detail .. ")" or ""))`, addr, opts, method, body, copts)
	}
	blocks := []block{
		{name: "timeout", conf: ngxConf{Workers: 1, Server: loc("/t", call(shared.addr, "{}", "slow", "3000", "{ timeout = 100 }"))},
			body: "timeout\n"},
		{name: "connect refused (nothing listening)", conf: ngxConf{Workers: 1, Server: loc("/t", call(dead, "{ timeout = 300 }", "echo", "x", "nil"))},
			body: "connect: refused\n"},
		{name: "connect timeout (nothing answering)", conf: ngxConf{Workers: 1, Server: loc("/t", call(silent, "{ timeout = 300 }", "echo", "x", "nil"))},
			body: "connect: timeout\n"},
		{name: "stream reset", conf: ngxConf{Workers: 1, Server: loc("/t", call(reset, "{ streams = 1 }", "echo", "x", "nil"))},
			bodyRe: `^connection lost: stream reset \(.*\)\n$`},
		{name: "stream closed", conf: ngxConf{Workers: 1, Server: loc("/t", call(eof, "{ streams = 1 }", "echo", "x", "nil"))},
			bodyRe: `^connection lost: stream closed by server \(.*\)\n$`},
		{name: "protocol error", conf: ngxConf{Workers: 1, Server: loc("/t", call(garbage, "{ streams = 1 }", "echo", "x", "nil"))},
			bodyRe: `^connection lost: protocol error \(.*\)\n$`},
		{name: "too large", conf: ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect(qt.addr, qt.opts({ max_frame_size = 1024 })))
                local res, err = conn:unary("echo", string.rep("b", 900), { headers = { ["x-big"] = string.rep("h", 300) } })
                ngx.say(err)`)},
			// the reason alone: the detail is in the third value
			body: "too large: request exceeds max_frame_size\n"},
		{name: "closed", conf: ngxConf{Workers: 1, Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect(qt.addr, qt.opts()))
                assert(conn:close())
                local res, err = conn:unary("echo", "x")
                ngx.say(err)`)},
			body: "closed\n"},
		{name: "server closing, then unavailable", conf: ngxConf{Workers: 1, QServer: closing, Server: loc("/t", connectT+`
                local res, err, info = conn:unary("slow", "10000", { timeout = 20000 })
                ngx.say(err, " (", info.detail, ")")
                res, err, info = conn:unary("echo", "x")
                ngx.say(err, info.detail and " (" .. info.detail .. ")" or "")`)},
			bodyRe: `^connection lost: closed by server \(Application error 0x0 \(remote\): server closing\)\n` +
				// Right after the loss the slot may not have recorded why yet;
				// once the first re-dial (made at once) has found the port
				// closed, that is why.
				`unavailable: (closed by server \(.*\)|refused \(.*\)|reconnecting)\n$`},
	}
	// The server-closing block needs the server shut down while its call
	// is in flight: run it by hand.
	last := blocks[len(blocks)-1]
	blocks = blocks[:len(blocks)-1]
	runBlocks(t, blocks)

	t.Run(last.name, func(t *testing.T) {
		n := startNginx(t, last.conf)
		go func() {
			testwait.For(10*time.Second, func() bool {
				closing.mu.Lock()
				defer closing.mu.Unlock()
				return closing.slow > 0
			})
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			closing.mu.Lock()
			s := closing.srv
			closing.mu.Unlock()
			_ = s.Shutdown(ctx)
		}()
		runBlock(t, n, last)
	})

	t.Run("idle timeout and stateless reset", func(t *testing.T) {
		// The "killed" server is replaced by one on a socket the test can
		// silence with its port open (nothing is sent, and no ICMP port
		// unreachable comes back as it would after a kill).
		_ = killed.close()
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		victim := qrpc.NewServer(&qrpc.ServerConfig{Logger: quietLog})
		killed.register(victim)
		mp := &testsrv.MutePacketConn{PacketConn: pc}
		if err := victim.ServePacketConn(mp, qrpc.ServerTLSConfig(serverTLSCert, nil)); err != nil {
			t.Fatal(err)
		}
		defer victim.Close()
		addr := pc.LocalAddr().String()
		n := startNginx(t, ngxConf{Workers: 1, Extra: map[string]string{"victim": addr}, Server: loc("/idle", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect(qt.victim, qt.opts({ idle_timeout = 1000 })))
                local res, err = conn:unary("slow", "20000", { timeout = 20000 })
                ngx.say(err)`) + loc("/reset", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qrpc.connect(qt.victim, qt.opts()))
                local res, err = conn:unary("echo", "x")
                if not res then ngx.say("first call: ", err) return end
                ngx.shared.qtest:set("up", 1)
                qt.wait(10, function() return ngx.shared.qtest:get("killed") end)
                res, err = conn:unary("echo", "x", { timeout = 3000 })
                ngx.say(err)`) + loc("/killed", `ngx.shared.qtest:set("killed", 1)`) +
			loc("/up", `ngx.print(ngx.shared.qtest:get("up") or 0)`)})
		// Idle timeout: silence the server while the call is in flight.
		go func() {
			testwait.For(10*time.Second, func() bool {
				killed.mu.Lock()
				defer killed.mu.Unlock()
				return killed.slow > 0
			})
			mp.Mute(true)
		}()
		if st, body := n.get("/idle"); st != 200 || !regexp.MustCompile(`^connection lost: idle timeout\n$`).MatchString(body) {
			t.Fatalf("idle: %d %q", st, body)
		}
		_ = victim.Close()
		_ = pc.Close() // the caller's socket: the server leaves it open
		// Stateless reset: a server on the same port with the same key,
		// a connection to it, the server killed and replaced.
		// SO_REUSEPORT: the third server binds the port before the
		// second's socket is closed, so the port is never closed (no ICMP
		// port unreachable, "refused", can come before the reset).
		pc2, err := testsrv.ListenReusePort(addr)
		if err != nil {
			t.Fatal(err)
		}
		second := qrpc.NewServer(&qrpc.ServerConfig{Logger: quietLog})
		killed.register(second)
		if err := second.ServePacketConn(pc2, qrpc.ServerTLSConfig(serverTLSCert, nil)); err != nil {
			t.Fatal(err)
		}
		defer second.Close()
		type answer struct {
			st   int
			body string
		}
		ch := make(chan answer, 1)
		go func() {
			st, body, _, err := n.do("GET", "/reset", "")
			if err != nil {
				body = err.Error()
			}
			ch <- answer{st, body}
		}()
		// Wait until /reset's connection is up, then kill and replace.
		if !testwait.For(10*time.Second, func() bool { _, up := n.get("/up"); return up == "1" }) {
			t.Fatal("/reset never connected")
		}
		pc3, err := testsrv.ListenReusePort(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer pc3.Close()
		third := qrpc.NewServer(&qrpc.ServerConfig{Logger: quietLog})
		killed.register(third)
		if err := third.ServePacketConn(pc3, qrpc.ServerTLSConfig(serverTLSCert, nil)); err != nil {
			t.Fatal(err)
		}
		defer third.Close()
		_ = pc2.Close() // the second server killed: no CONNECTION_CLOSE
		n.get("/killed")
		a := <-ch
		// Any packet of the client after the kill (an ACK, a keep-alive)
		// draws the reset before the call goes out: then the call is not
		// sent and says unavailable, with the same reason.
		if a.st != 200 || !regexp.MustCompile(`^(connection lost|unavailable): stateless reset\n$`).MatchString(a.body) {
			t.Fatalf("reset: %d %q", a.st, a.body)
		}
	})
}

var quietLog = slog.New(slog.DiscardHandler)
