package nginx

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

const probeLua = `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                if ngx.var.arg_op == "inflight" then
                    return ngx.say(qrpc.stats().inflight)
                end
                local conn = assert(qrpc.connect(qt[ngx.var.arg_s], qt.opts({ server_name = "localhost" })))
                if ngx.var.arg_op == "event" then
                    local ok, err = conn:event("notify", "x")
                    return ngx.say(ok and "sent" or err)
                end
                assert(conn:unary("echo", "warm"))
                local _, err = conn:unary("slow", "9000", { timeout = 9500 })
                ngx.say(err or "answered")
`

// TestKilledServerHeardWhenQuietNginx: one call in flight on a quiet
// connection (its request acknowledged, nothing else to send), its server
// killed with kill -9 (the port closed): the call fails "connection lost:
// refused" about a probe interval and the refusal's grace later, not at
// its 9.5 s timeout. The bound is measured here: the same kill of a second
// server heard by a connection that sends an event to the dead port at
// once, plus two probe intervals.
func TestKilledServerHeardWhenQuietNginx(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	srvs, extra := startDemos(t, 2)
	n := startNginx(t, ngxConf{Workers: 1, Extra: extra, Server: loc("/p", probeLua)})

	// The loopback's round trip, for the time QUIC may still owe a packet
	// after the request (below).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, srvs[0].addr, &qrpc.Config{CAPEM: ca.CertPEM, ServerName: "localhost", CloseLinger: -1})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := c.Unary(ctx, "echo", []byte("rtt")); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(t0)
	_ = c.Close()

	type result struct {
		body string
		at   time.Time
	}
	call := func(s string) chan result {
		ch := make(chan result, 1)
		go func() {
			_, body := n.get("/p?s=" + s)
			ch <- result{strings.TrimSpace(body), time.Now()}
		}()
		return ch
	}
	quietCh := call("s1")
	testwait.Until(t, "the call in flight", 20*time.Second, func() bool {
		_, b := n.get("/p?op=inflight")
		return strings.TrimSpace(b) == "1"
	})
	loudCh := call("s2")
	testwait.Until(t, "both calls in flight", 20*time.Second, func() bool {
		_, b := n.get("/p?op=inflight")
		return strings.TrimSpace(b) == "2"
	})
	// Quiet: past the server's ACK delay (25 ms) and a probe timeout of a
	// few round trips after the request, QUIC sends nothing more on its
	// own. Without the probes a kill now is heard at the call's timeout.
	quietAt := time.Now().Add(2 * (25*time.Millisecond + 4*rtt))
	testwait.Until(t, "the connection quiet", 10*time.Second, func() bool { return time.Now().After(quietAt) })

	killedLoud := time.Now()
	srvs[1].kill()
	// The loud connection probes too: on a loaded machine it may have
	// heard the kill before the event goes, and refuses it.
	if _, b := n.get("/p?op=event&s=s2"); strings.TrimSpace(b) != "sent" && strings.TrimSpace(b) != "unavailable: refused" {
		t.Fatalf("event to the dead port: %q", b)
	}
	killedQuiet := time.Now()
	srvs[0].kill()
	quiet, loud := <-quietCh, <-loudCh
	for name, r := range map[string]result{"quiet": quiet, "loud": loud} {
		if r.body != "connection lost: refused" {
			t.Errorf("the %s connection's call: %q, want connection lost: refused", name, r.body)
		}
	}
	heardQuiet, heardLoud := quiet.at.Sub(killedQuiet), loud.at.Sub(killedLoud)
	bound := heardLoud + 2*qrpc.MaxProbeInterval
	t.Logf("kill -9 heard after %v on the quiet connection, %v on the loud one (bound %v, rtt %v)", heardQuiet, heardLoud, bound, rtt)
	if heardQuiet > bound {
		t.Errorf("the quiet connection heard the kill after %v, the loud one after %v: want at most %v", heardQuiet, heardLoud, bound)
	}
}
