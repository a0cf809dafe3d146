package bridge

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestPoolOptsSRVThrottle: an SRV name is an addr line of its own (no
// port); throttle_k and throttle_codes fill PoolConfig.Throttle.
func TestPoolOptsSRVThrottle(t *testing.T) {
	cmd := Command{Op: OpConnect, Addr: []byte("ignored:1"), Opts: recs(
		"addr=_qrpc._udp.svc.example.internal\naddr=10.0.0.1:8443\nthrottle_k=2\nthrottle_codes=8,14\n")}
	addrs, pc, err := connectConfig(&cmd, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(addrs, ",") != "_qrpc._udp.svc.example.internal,10.0.0.1:8443" || pc.Throttle.K != 2 ||
		len(pc.Throttle.Codes) != 2 || pc.Throttle.Codes[0] != 8 || pc.Throttle.Codes[1] != 14 {
		t.Fatalf("%v %+v", addrs, pc.Throttle)
	}
	_, pc, err = connectConfig(&Command{Op: OpConnect, Addr: []byte("a:1"), Opts: recs("throttle_k=0\n")}, slog.Default())
	if err != nil || pc.Throttle.K != 0 {
		t.Fatalf("throttle_k=0: %+v %v", pc.Throttle, err)
	}
	_, pc, err = connectConfig(&Command{Op: OpConnect, Addr: []byte("a:1"), Opts: recs("throttle_k=1.5\n")}, slog.Default())
	if err != nil || pc.Throttle.K != 1.5 || pc.Throttle.Codes != nil {
		t.Fatalf("throttle_k=1.5: %+v %v", pc.Throttle, err)
	}
}

func TestPoolOpts(t *testing.T) {
	cmd := Command{Op: OpConnect, Addr: []byte("ignored:1"), Opts: recs(
		"addr=10.0.0.1:8443\naddr=svc.local:8443\nbalance=hash\nhealth_failures=5\nhealth_eject_ms=2500\nhealth_stall_ms=350\n" +
			"check_method=health\ncheck_interval_ms=1000\ncheck_timeout_ms=300\nretries=2\nresolve_ms=30000\nresolver=127.0.0.1:5353\nstream_batch=4\n")}
	addrs, pc, err := connectConfig(&cmd, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(addrs, ",") != "10.0.0.1:8443,svc.local:8443" || pc.Balance != qrpc.Hash || pc.Failures != 5 ||
		pc.Eject != 2500*time.Millisecond || pc.Stall != 350*time.Millisecond || pc.Check.Method != "health" || pc.Check.Interval != time.Second ||
		pc.Check.Timeout != 300*time.Millisecond || pc.Retries != 2 || pc.Resolve != 30*time.Second ||
		pc.Resolver != "127.0.0.1:5353" || pc.StreamBatch != 4 {
		t.Fatalf("%v %+v", addrs, pc)
	}
	// No opts: the v1 address, defaults.
	addrs, pc, err = connectConfig(&Command{Op: OpConnect, Addr: []byte("127.0.0.1:9")}, slog.Default())
	if err != nil || len(addrs) != 1 || addrs[0] != "127.0.0.1:9" || pc.Balance != qrpc.RoundRobin || pc.Retries != 0 {
		t.Fatalf("%v %+v %v", addrs, pc, err)
	}
	// health_stall_ms=0 turns the stall signal off (qrpc: negative), it
	// does not ask for qrpc's default.
	_, pc, err = connectConfig(&Command{Op: OpConnect, Addr: []byte("a:1"), Opts: recs("health_stall_ms=0\n")}, slog.Default())
	if err != nil || pc.Stall >= 0 {
		t.Fatalf("health_stall_ms=0: %v %v", pc.Stall, err)
	}
	for _, tc := range []struct{ opts, want string }{
		{"color=blue", "unknown record key 65535"},
		{"balance=random", `unknown balance "random"`},
		{"addr=a:1\naddr=a:1", `duplicate addr "a:1"`},
		{"addr=nope", `addr "nope" is not host:port`},
		{"health_failures=0", "health_failures must be an integer 1..1073741824, got 0"},
		{"health_eject_ms=-5", "health_eject_ms must be an integer 0..1073741824, got -5"},
		{"health_stall_ms=soon", "record 5: a number of 4 bytes"},
		{"retries=17", "retries must be an integer 0..16"},
		{"resolver=dns", `resolver "dns" is not host:port`},
		{"stream_batch=0", "stream_batch must be an integer 1..1024"},
		{"stream_batch=1025", "stream_batch must be an integer 1..1024"},
		{"health_on=", "health_on: 0 is not a non-empty set"},
		{"hedge_max=99", "hedge_max must be an integer 0..4"},
		{"addr=_qrpc._udp", `addr "_qrpc._udp" is not host:port or _service._proto.name`},
		{"throttle_k=0.5", "throttle_k must be 0 or 1..1e6"},
		{"throttle_k=-1", "throttle_k must be 0 or 1..1e6"},
		{"throttle_k=NaN", "throttle_k must be 0 or 1..1e6"},
		{"throttle_k=Inf", "throttle_k must be 0 or 1..1e6"},
		{"throttle_k=two", "record 20: a number of 3 bytes"},
		{"throttle_k=2\nthrottle_codes=", "throttle_codes: 0 is not a code"},
		{"throttle_k=2\nthrottle_codes=0", "throttle_codes: 0 is not a code"},
		{"throttle_k=2\nthrottle_codes=-8", "throttle_codes: -8 is not a code"},
		{"throttle_k=2\nthrottle_codes=4294967296", "throttle_codes: 4294967296 is not a code"},
		{"throttle_k=2\nthrottle_codes=8,8", "throttle_codes: 8 twice"},
		{"throttle_k=2\nthrottle_codes=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "at most 16 codes"},
		{"throttle_codes=8", "throttle_codes needs throttle_k"},
	} {
		_, _, err := connectConfig(&Command{Op: OpConnect, Addr: []byte("a:1"), Opts: recs(tc.opts)}, slog.Default())
		if st, msg := StatusOf(err); st != ErrBadArg || !strings.Contains(msg, tc.want) {
			t.Errorf("%q: %d %q, want %q", tc.opts, st, msg, tc.want)
		}
	}
}

// TestRuntimePool: a CONNECT with three addresses is one handle whose calls
// spread over the three servers; a hash key keeps its server; PEERS lists
// them; bad opts are refused before anything runs.
func TestRuntimePool(t *testing.T) {
	var srvs []*testsrv.Server
	var cas [][]byte
	var opts bytes.Buffer
	for range 3 {
		ts := testsrv.Start(t, testsrv.Options{})
		srvs = append(srvs, ts)
		cas = append(cas, ts.CA.CertPEM)
		fmt.Fprintf(&opts, "addr=%s\n", ts.Addr)
	}
	opts.WriteString("balance=hash\n") // calls without a key go round-robin
	r := New(newGoMemory(t), nil)
	h := newTestHost(t, r, true)
	h.submit(Command{Op: OpConnect, CallID: 1, TimeoutMS: 3000, CA: bytes.Join(cas, nil), Opts: recs(opts.String())}, StatusPending)
	c := h.wait(1, 10*time.Second)
	if c.Status != StatusOK || c.Handle == 0 {
		t.Fatalf("connect: %d %q", c.Status, text(c))
	}
	conn := c.Handle
	peers := func() map[string]string {
		out, err := r.Peers(conn)
		if err != nil {
			t.Fatal(err)
		}
		// one line per server: "peer_addr=A\npeer_state=S\n..." -> m[A] = "state=S ..."
		m := map[string]string{}
		for _, p := range strings.Split(recText(out), "peer_addr=")[1:] {
			f := strings.Fields(strings.ReplaceAll(p, "peer_", ""))
			m[f[0]] = strings.Join(f[1:], " ")
		}
		return m
	}
	// Connect returns once one server is up (the others get a short
	// grace): wait for all three, so that round-robin is exact.
	if !testwait.For(10*time.Second, func() bool {
		up := 0
		for _, v := range peers() {
			if strings.HasPrefix(v, "state=up ") {
				up++
			}
		}
		return up == 3
	}) {
		t.Fatalf("not all 3 up: peers %v", peers())
	}
	for i := range 30 {
		id := uint64(10 + i)
		h.submit(unary(conn, id, "echo", "x", 5000), StatusPending)
		if code, _, body := result(t, h.wait(id, 5*time.Second)); code != 0 || string(body) != "x" {
			t.Fatalf("echo: %d %q", code, body)
		}
	}
	p := peers()
	for _, ts := range srvs {
		if p[ts.Addr] != "state=up inflight=0 calls=10 failures=0 ejected_until_ms=0 stalled=0" {
			t.Fatalf("peers %v", p)
		}
	}
	for i := range 20 {
		id := uint64(100 + i)
		cmd := unary(conn, id, "echo", "k", 5000)
		cmd.HashKey = []byte("user-42")
		h.submit(cmd, StatusPending)
		h.wait(id, 5*time.Second)
	}
	moved := 0
	for _, ts := range srvs {
		if p := peers()[ts.Addr]; p == "state=up inflight=0 calls=30 failures=0 ejected_until_ms=0 stalled=0" {
			moved++
		}
	}
	if moved != 1 {
		t.Fatalf("hash key spread: %v", peers())
	}
	if n := r.QUICConns(); n != 3 {
		t.Fatalf("%d QUIC connections", n)
	}
	if msg := h.submit(Command{Op: OpConnect, CallID: 2, Opts: recs("balance=fair")}, ErrBadArg); !strings.Contains(msg, "unknown balance") {
		t.Fatalf("bad opts: %q", msg)
	}
	if _, err := r.Peers(999); err == nil {
		t.Fatal("peers of an unknown handle")
	}
	// Through qrpc_query's path: conn 0 is the worker's QUIC connections.
	out, msg := r.Query(&Command{Op: OpPeers})
	if out.Status != StatusOK || recText([]byte(text(out))) != "connections=3\n" {
		t.Fatalf("PEERS 0: %d %q %q", out.Status, text(out), msg)
	}
	r.Free(&out)
	out, _ = r.Query(&Command{Op: OpPeers, Conn: conn})
	if out.Status != StatusOK || strings.Count(recText([]byte(text(out))), "peer_state=up") != 3 {
		t.Fatalf("PEERS: %d %q", out.Status, text(out))
	}
	r.Free(&out)
}

// TestRuntimeSRVThrottle: a CONNECT whose addr line is an SRV name reaches
// the server its record names (verified against the record's target,
// certs.LocalTarget: no server name is set); with throttle_k and throttle_codes,
// calls answered with the listed code soon fail locally with
// "unavailable: throttled", and the worker's metrics count them.
func TestRuntimeSRVThrottle(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	_, port, _ := net.SplitHostPort(ts.Addr)
	n, _ := strconv.Atoi(port)
	dns := dnstest.Start(t, "_qrpc._udp.svc.test.")
	dns.SetA(certs.LocalTarget, "127.0.0.1")
	dns.SetSRV("_qrpc._udp.svc.test", dnstest.SRV{Priority: 1, Weight: 5, Port: uint16(n), Target: certs.LocalTarget})
	r := New(newGoMemory(t), nil)
	h := newTestHost(t, r, true)
	opts := "addr=_qrpc._udp.svc.test\nresolver=" + dns.Addr + "\nthrottle_k=2\nthrottle_codes=7\n"
	h.submit(Command{Op: OpConnect, CallID: 1, TimeoutMS: 3000, CA: ts.CA.CertPEM, Opts: recs(opts)}, StatusPending)
	c := h.wait(1, 10*time.Second)
	if c.Status != StatusOK || c.Handle == 0 {
		t.Fatalf("connect: %d %q", c.Status, text(c))
	}
	conn := c.Handle
	h.submit(unary(conn, 2, "echo", "x", 5000), StatusPending)
	if code, _, body := result(t, h.wait(2, 5*time.Second)); code != 0 || string(body) != "x" {
		t.Fatalf("echo: %d %q", code, body)
	}
	throttled := 0
	for i := range 100 {
		id := uint64(10 + i)
		cmd := unary(conn, id, "code", "", 5000)
		st, msg := r.Submit(h, &cmd)
		switch st {
		case StatusPending:
			if code, _, _ := result(t, h.wait(id, 5*time.Second)); code != 7 {
				t.Fatalf("code: %d", code)
			}
		case ErrUnavail:
			if msg != "unavailable: throttled" {
				t.Fatalf("refused: %q", msg)
			}
			throttled++
		default:
			t.Fatalf("call %d: status %d %q", i, st, msg)
		}
	}
	t.Logf("%d of 100 calls throttled, the others answered code 7", throttled)
	if throttled < 80 {
		t.Fatalf("only %d of 100 throttled", throttled)
	}
	want := fmt.Sprintf("qrpc_client_throttled_total{method=\"code\"} %d\n", throttled)
	if m := string(r.Metrics().Text()); !strings.Contains(m, want) {
		t.Fatalf("metrics lack %q:\n%s", want, m)
	}
}
