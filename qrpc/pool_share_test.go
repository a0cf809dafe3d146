package qrpc_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestPoolImportVerdicts: verdicts from another view eject, extend, keep
// and bring back a server; the panic threshold holds for them too; a
// remote stall sends calls elsewhere; View reports this view's own
// verdicts only (an imported stall is not echoed).
func TestPoolImportVerdicts(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	a, b := addrs[0], addrs[1]
	const bName = "s1" // what b's "who" answers
	p := f.dial(t, addrs, &qrpc.PoolConfig{})

	view := func(addr string) qrpc.Verdict {
		for _, v := range p.View(0).Peers {
			if v.Addr == addr {
				return v
			}
		}
		t.Fatalf("%s not in the view", addr)
		return qrpc.Verdict{}
	}
	callsTo := func(n int) map[string]int {
		got := map[string]int{}
		for i := 0; i < n; i++ {
			res, err := poolCall(p, 5*time.Second, "who", "")
			if err != nil {
				t.Fatal(err)
			}
			got[string(res.Body)]++
		}
		return got
	}

	p.Import([]qrpc.Verdict{{Addr: b, Ejected: true, EjectFor: time.Minute}})
	if v := view(b); !v.Ejected || v.EjectFor < 59*time.Second {
		t.Fatalf("after an imported 1 min ejection: %+v", v)
	}
	if got := callsTo(20); got[bName] != 0 {
		t.Errorf("calls after b's imported ejection: %v", got)
	}
	// a Keep verdict leaves the ejection; a shorter one does not shorten it
	p.Import([]qrpc.Verdict{{Addr: b, Keep: true}, {Addr: b, Ejected: true, EjectFor: time.Second}})
	if v := view(b); !v.Ejected || v.EjectFor < 58*time.Second {
		t.Fatalf("after Keep and a shorter ejection: %+v", v)
	}
	// the last server up is never ejected, from here or elsewhere
	p.Import([]qrpc.Verdict{{Addr: a, Ejected: true, EjectFor: time.Minute}})
	if v := view(a); v.Ejected {
		t.Errorf("a, the last server up, ejected by an import: %+v", v)
	}
	// back elsewhere: back here
	p.Import([]qrpc.Verdict{{Addr: b}})
	if v := view(b); v.Ejected {
		t.Fatalf("after an imported return: %+v", v)
	}
	if got := callsTo(20); got[bName] == 0 {
		t.Errorf("calls after b came back: %v", got)
	}

	// a remote stall: calls go to a while another server can take them,
	// and the view does not report it as its own
	p.Import([]qrpc.Verdict{{Addr: b, Keep: true, Stalled: true}})
	if got := callsTo(20); got[bName] != 0 {
		t.Errorf("calls while b is stalled elsewhere: %v", got)
	}
	if v := view(b); v.Stalled {
		t.Errorf("an imported stall echoed in the view: %+v", v)
	}
	if in, _ := peerState(p, b); in.State != qrpc.PeerUp {
		t.Errorf("b's state under a remote stall: %v, want up", in.State)
	}
	p.Import([]qrpc.Verdict{{Addr: b, Keep: true}})
	if got := callsTo(20); got[bName] == 0 {
		t.Errorf("calls after the remote stall was lifted: %v", got)
	}
}

// TestPoolImportResolved: a list resolved by another view replaces the
// pool's servers (new ones join, missing ones drain); View hands out the
// pool's own resolved list once per generation.
func TestPoolImportResolved(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	dns := dnstest.Start(t, "svc.qrpc.test.")
	dns.Set("127.0.0.1")
	_, port, _ := net.SplitHostPort(addrs[0])
	_, port2, _ := net.SplitHostPort(addrs[1])
	// the certificate is for localhost: the name checked is set
	p := f.dial(t, []string{"svc.qrpc.test:" + port}, &qrpc.PoolConfig{
		Config: qrpc.Config{ServerName: "localhost"}, Resolver: dns.Addr})

	v := p.View(0)
	if v.ResolvedGen == 0 || len(v.Resolved) != 1 || v.Resolved[0].Addr != addrs[0] || v.Resolved[0].Name != "svc.qrpc.test" {
		t.Fatalf("the dial's own list: %+v", v)
	}
	if again := p.View(v.ResolvedGen); again.Resolved != nil {
		t.Errorf("the list handed out again for a generation already seen: %+v", again.Resolved)
	}

	other := "127.0.0.1:" + port2
	if err := p.ImportResolved([]qrpc.Resolved{{Addr: other, Name: "svc.qrpc.test", Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	// the new server is dialled in the background; the old one drains
	testwait.Until(t, "the imported server up", 10*time.Second, func() bool {
		in, ok := peerState(p, other)
		return ok && in.State == qrpc.PeerUp
	})
	for i := 0; i < 10; i++ {
		res, err := poolCall(p, 5*time.Second, "who", "")
		if err != nil || string(res.Body) != "s1" {
			t.Fatalf("after importing [%s]: %v %+v, want every call on s1", other, err, res)
		}
	}
	// an imported list is not this view's own resolution
	if w := p.View(v.ResolvedGen); w.ResolvedGen != v.ResolvedGen {
		t.Errorf("importing moved the pool's own generation: %d -> %d", v.ResolvedGen, w.ResolvedGen)
	}
}

// TestPoolShareRun: View reports the failures in a row a view counted
// and the runs it ended; an imported run becomes the pool's own (plus
// the failures View has not reported yet); a run Reached ejects the
// server, an imported one does not; an answer ends an imported run.
func TestPoolShareRun(t *testing.T) {
	f := newFleet(t)
	addrs := f.start(2)
	b := addrs[1]
	const bName = "s1"
	p := f.dial(t, addrs, &qrpc.PoolConfig{Balance: qrpc.Hash, Failures: 3, Eject: time.Minute, Stall: -1})
	key := ""
	for i := 0; i < 1000 && key == ""; i++ {
		res, err := poolCall(p, 5*time.Second, "who", "k"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Body) == bName {
			key = "k" + strconv.Itoa(i)
		}
	}
	if key == "" {
		t.Fatal("no key of 1000 maps to b")
	}
	run := func() qrpc.Verdict {
		for _, v := range p.View(0).Peers {
			if v.Addr == b {
				return v
			}
		}
		t.Fatalf("%s not in the view", b)
		return qrpc.Verdict{}
	}
	failures := func() int { in, _ := peerState(p, b); return in.Failures }
	// timeout makes a call to b time out, and waits until the pool has
	// counted it (the attempt records its outcome after the caller has
	// its error) as the run's failure number want.
	timeout := func(want int) {
		t.Helper()
		if _, err := poolCall(p, 50*time.Millisecond, "work", key); err == nil {
			t.Fatal("a call to b answered within 50 ms with b taking 10 s")
		}
		testwait.Until(t, "the timeout counted", 10*time.Second, func() bool { return failures() >= want })
	}
	imp := func(v qrpc.Verdict) { v.Addr, v.Keep, v.HasRun = b, true, true; p.Import([]qrpc.Verdict{v}) }

	if v := run(); v.Counted != 0 || v.Resets != 0 {
		t.Fatalf("before any failure: %+v", v)
	}
	f.srvs[1].delay.Store(10000)
	timeout(1)
	if v := run(); v.Counted != 1 || v.SinceReset != 1 || v.Resets != 0 || failures() != 1 {
		t.Fatalf("after one timeout: %+v, failures %d", v, failures())
	}
	// a failure View has not reported is added to the imported run
	timeout(2)
	imp(qrpc.Verdict{Run: 1})
	if n := failures(); n != 2 {
		t.Errorf("imported run 1 with one failure not reported yet: failures %d, want 2", n)
	}
	if v := run(); v.Counted != 2 || v.SinceReset != 2 {
		t.Fatalf("after two timeouts: %+v", v)
	}
	// reported now: the imported run is the run
	imp(qrpc.Verdict{Run: 2})
	if n := failures(); n != 2 {
		t.Errorf("imported run 2, all reported: failures %d", n)
	}
	// an imported run past the limit does not eject; Reached does
	imp(qrpc.Verdict{Run: 5})
	if in, _ := peerState(p, b); in.Failures != 5 || in.State != qrpc.PeerUp {
		t.Errorf("imported run 5: %+v, want failures 5 and b up", in)
	}
	imp(qrpc.Verdict{Run: 1, Reached: true})
	if in, _ := peerState(p, b); in.State != qrpc.PeerUp {
		t.Errorf("Reached with a run of 1 (of 3): %+v, want b up", in)
	}
	imp(qrpc.Verdict{Run: 3, Reached: true})
	if in, _ := peerState(p, b); in.State != qrpc.PeerEjected || in.Failures != 3 {
		t.Fatalf("Reached with a run of 3: %+v, want b ejected", in)
	}
	// back (here from another view): the run ends
	p.Import([]qrpc.Verdict{{Addr: b}})
	if v := run(); v.Ejected || v.Resets != 1 || v.SinceReset != 0 || failures() != 0 {
		t.Fatalf("after b came back: %+v, failures %d", v, failures())
	}
	// an answer ends an imported run, once
	f.srvs[1].delay.Store(0)
	imp(qrpc.Verdict{Run: 2})
	for i := 0; i < 3; i++ {
		if _, err := poolCall(p, 5*time.Second, "work", key); err != nil {
			t.Fatal(err)
		}
	}
	if v := run(); v.Resets != 2 || v.SinceReset != 0 || failures() != 0 {
		t.Errorf("after answers on an imported run of 2: %+v, failures %d, want 2 resets", v, failures())
	}
}
