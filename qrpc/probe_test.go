package qrpc_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// awaitQuiet waits until c's connection sends nothing of its own (the
// request acknowledged, no ACK of ours pending) for as long as QUIC could
// still owe a packet: the peer's ACK delay (25 ms) and a probe timeout of
// a few RTTs, measured on the connection. Probes do not count.
func awaitQuiet(t *testing.T, c *qrpc.Client) {
	t.Helper()
	last, _, _, _ := qrpc.WireForTest(c)
	since := time.Now()
	testwait.Until(t, "the connection to go quiet", 30*time.Second, func() bool {
		sends, _, srtt, ok := qrpc.WireForTest(c)
		if !ok {
			t.Fatal("the connection went away")
		}
		if sends != last {
			last, since = sends, time.Now()
			return false
		}
		return time.Since(since) > 2*(25*time.Millisecond+4*srtt)
	})
}

// TestKilledServerHeardWhenQuiet: a call in flight on a connection that
// sends nothing (its request acknowledged) fails "connection lost:
// refused" soon after its server is killed with its port closed, not at
// its deadline: the connection probes the server while calls are in
// flight. The bound is the machine's own: the time the same kill takes to
// be heard by a connection that sends an event to the dead port at once,
// plus two probe intervals.
func TestKilledServerHeardWhenQuiet(t *testing.T) {
	f := newFleet(t)
	still, loud := f.add("127.0.0.1:0"), f.add("127.0.0.1:0")
	for _, m := range []*member{still, loud} {
		m.delay.Store(60_000)
	}
	dial := func(m *member) *qrpc.Client {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := qrpc.Dial(ctx, m.addr, &qrpc.Config{CAPEM: f.ca.CertPEM, Logger: quiet,
			BackoffBase: time.Minute, BackoffMax: time.Minute, CloseLinger: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	cq, cl := dial(still), dial(loud)
	const deadline = 10 * time.Second
	type outcome struct {
		err error
		at  time.Time
	}
	start := func(c *qrpc.Client) chan outcome {
		ch := make(chan outcome, 1)
		_, err := c.Start(&qrpc.Call{Method: []byte("work"), Deadline: time.Now().Add(deadline)},
			func(_ *qrpc.Response, err error) { ch <- outcome{err, time.Now()} })
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	gotQ, gotL := start(cq), start(cl)
	testwait.Until(t, "both calls at their servers", 10*time.Second, func() bool {
		return still.hits.Load() == 1 && loud.hits.Load() == 1
	})
	awaitQuiet(t, cq)

	killedL := time.Now()
	loud.kill()
	_ = cl.Event([]byte("tick"), nil, nil) // a packet to the dead port: heard at once
	killedQ := time.Now()
	still.kill()
	var q, l outcome
	select {
	case q = <-gotQ:
	case <-time.After(deadline + 5*time.Second):
		t.Fatal("the quiet call never ended")
	}
	l = <-gotL
	for name, o := range map[string]outcome{"quiet": q, "loud": l} {
		if r := qrpc.Classify(o.err); r.Word != qrpc.WordConnLost || r.Reason != qrpc.ReasonRefused {
			t.Errorf("%s connection's call: %q, want connection lost: refused", name, qrpc.ErrorString(o.err))
		}
	}
	heardLoud, heardQuiet := l.at.Sub(killedL), q.at.Sub(killedQ)
	bound := heardLoud + 2*qrpc.MaxProbeInterval
	t.Logf("kill heard after %v on the quiet connection, %v on the loud one (bound %v)", heardQuiet, heardLoud, bound)
	if heardQuiet > bound {
		t.Errorf("the quiet connection heard the kill after %v, the loud one after %v: want at most %v", heardQuiet, heardLoud, bound)
	}
}

// TestProbesSpareALiveServer: the probes of a connection whose call waits
// a long time for its answer do it no harm (the server's QUIC stack drops
// them, and answers no stateless reset), and the answer comes.
func TestProbesSpareALiveServer(t *testing.T) {
	f := newFleet(t)
	m := f.add("127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, m.addr, &qrpc.Config{CAPEM: f.ca.CertPEM, Logger: quiet, CloseLinger: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Long enough for many probes: 20 intervals.
	m.delay.Store(int64(20 * qrpc.MaxProbeInterval / time.Millisecond))
	resp, err := unary(c, 30*time.Second, "work", nil)
	if err != nil || string(resp.Body) != "s0" {
		t.Fatalf("the slow call: %v", err)
	}
	_, probes, _, _ := qrpc.WireForTest(c)
	if probes < 5 {
		t.Errorf("%d probes sent during the call, want several", probes)
	}
	if st := c.Stats(); st.Reconnects != 0 {
		t.Errorf("%d reconnects", st.Reconnects)
	}
	if _, err := unary(c, 5*time.Second, "who", nil); err != nil {
		t.Fatalf("a call after the probes: %v", err)
	}
}

// TestKilledServerHeardWhenQuietManyConns: many quiet connections to one
// killed server all hear the kill about as soon as one does, though the
// kernel answers a closed port's packets with ICMP port unreachable at a
// limited rate (Linux: per host a burst of 6, then one a second; none on
// loopback, so the servers live in a network namespace of their own,
// reached over a veth pair, where root can make one): a refusal heard by
// one connection to an address reaches the others to it. The bound is
// the machine's own: the time a connection that sends to the dead port at
// once takes to hear it, plus what ending as many connections at once
// takes (a server closing them), plus two probe intervals.
func TestKilledServerHeardWhenQuietManyConns(t *testing.T) {
	const conns = 32
	ca, cert, err := certs.NewLocal("many conns ca")
	if err != nil {
		t.Fatal(err)
	}
	// The two servers on hosts of their own: the refusals the loud
	// connection and its re-dial meet use up the ICMP budget of its host
	// only.
	listenStill, listenLoud := remoteListener(t, 0), remoteListener(t, 1)
	type server struct {
		pc   *net.UDPConn
		srv  *qrpc.Server
		hits atomic.Int64
	}
	serve := func(listen func() *net.UDPConn) *server {
		s := &server{pc: listen()}
		s.srv = qrpc.NewServer(&qrpc.ServerConfig{Logger: quiet})
		s.srv.Handle("work", func(ctx context.Context, _ *qrpc.Request, _ *qrpc.Response) {
			s.hits.Add(1)
			<-ctx.Done() // answers nothing: the calls wait for the kill
		})
		if err := s.srv.ServePacketConn(s.pc, qrpc.ServerTLSConfig(cert, nil)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.srv.Close() })
		return s
	}
	// kill closes the socket under the server (as kill -9 would: no
	// CONNECTION_CLOSE, the port closed).
	kill := func(s *server) {
		_ = s.pc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.srv.Shutdown(ctx)
	}
	still, loud := serve(listenStill), serve(listenLoud)
	dial := func(s *server) *qrpc.Client {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := qrpc.Dial(ctx, s.pc.LocalAddr().String(), &qrpc.Config{CAPEM: ca.CertPEM, ServerName: "localhost",
			Logger: quiet, BackoffBase: time.Minute, BackoffMax: time.Minute, CloseLinger: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	type outcome struct {
		err error
		at  time.Time
	}
	const deadline = 10 * time.Second
	start := func(c *qrpc.Client) chan outcome {
		ch := make(chan outcome, 1)
		_, err := c.Start(&qrpc.Call{Method: []byte("work"), Deadline: time.Now().Add(deadline)},
			func(_ *qrpc.Response, err error) { ch <- outcome{err, time.Now()} })
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	// What ending this many connections at once costs the machine: a
	// server on the loud host closes as many, with a call in flight on
	// each (its CONNECTION_CLOSE ends them: no ICMP).
	closer := serve(listenLoud)
	var closing []chan outcome
	for range conns {
		closing = append(closing, start(dial(closer)))
	}
	testwait.Until(t, "every call at the closing server", 10*time.Second, func() bool { return closer.hits.Load() == conns })
	closedAt := time.Now()
	gone, cancelGone := context.WithCancel(context.Background())
	cancelGone() // no grace for the calls: closed at once
	_ = closer.srv.Shutdown(gone)
	var endAll time.Duration
	for i, ch := range closing {
		select {
		case o := <-ch:
			endAll = max(endAll, o.at.Sub(closedAt))
		case <-time.After(deadline + 5*time.Second):
			t.Fatalf("call %d on the closing server never ended", i)
		}
	}

	cl := dial(loud)
	gotL := start(cl)
	var cs []*qrpc.Client
	var got []chan outcome
	for range conns {
		c := dial(still)
		cs = append(cs, c)
		got = append(got, start(c))
	}
	testwait.Until(t, "every call at its server", 10*time.Second, func() bool {
		return still.hits.Load() == conns && loud.hits.Load() == 1
	})
	for _, c := range cs {
		awaitQuiet(t, c)
	}

	killedL := time.Now()
	kill(loud)
	_ = cl.Event([]byte("tick"), nil, nil) // a packet to the dead port: heard at once
	var l outcome
	select {
	case l = <-gotL:
	case <-time.After(deadline + 5*time.Second):
		t.Fatal("the loud call never ended")
	}
	heardLoud := l.at.Sub(killedL)
	if r := qrpc.Classify(l.err); r.Word != qrpc.WordConnLost || r.Reason != qrpc.ReasonRefused {
		t.Fatalf("the loud connection's call: %q, want connection lost: refused", qrpc.ErrorString(l.err))
	}
	// A machine that stands still while the quiet ones wait delays them
	// by as much: that is not the code's.
	pz := testsrv.ProbePauses()
	killedQ := time.Now()
	kill(still)
	var heard []time.Duration
	for i, ch := range got {
		var q outcome
		select {
		case q = <-ch:
		case <-time.After(deadline + 5*time.Second):
			t.Fatalf("call %d never ended", i)
		}
		if r := qrpc.Classify(q.err); r.Word != qrpc.WordConnLost || r.Reason != qrpc.ReasonRefused {
			t.Errorf("call %d: %q, want connection lost: refused", i, qrpc.ErrorString(q.err))
		}
		heard = append(heard, q.at.Sub(killedQ))
	}
	pause := pz.End()
	bound := heardLoud + endAll + 2*qrpc.MaxProbeInterval + pause
	var worst time.Duration
	late := 0
	for _, d := range heard {
		worst = max(worst, d)
		if d > bound {
			late++
		}
	}
	t.Logf("%d quiet connections: the last heard the kill after %v, the loud one after %v, %d closed by their server ended within %v, longest pause %v (bound %v)",
		conns, worst, heardLoud, conns, endAll, pause, bound)
	if late > 0 {
		t.Errorf("%d of %d quiet connections heard the kill after more than %v (the last after %v)", late, conns, bound, worst)
	}
}
