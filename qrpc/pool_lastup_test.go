package qrpc

import (
	"testing"
	"time"
)

// TestSimLastUpBackStaysLocal: view 1 of a shared pool loses its server
// up (a DNS change takes A out while its connection to C is down) and
// lifts B's ejection so as to keep one server up (evLastUp). That lift
// is a local exception to the ejection, like an imported ejection that
// "the last server up stays up here" refuses; it is no evidence that B
// answers, so it is not published: view 2, which still has C up, keeps
// B ejected (and B's back-off goes on from its length).
func TestSimLastUpBackStaysLocal(t *testing.T) {
	cfg := PoolConfig{Failures: 2, Eject: 10 * time.Second, Stall: -1}
	w, sp := simSmall(t, 3, nil, cfg, false, 2)
	v1, v2 := sp.views[0], sp.views[1]
	a, b, c := w.servers[0], w.servers[1], w.servers[2]
	// B fails in view 1: ejected (A and C up), published, and imported
	// by view 2.
	pb1 := v1.p.peers[b.addr]
	v1.p.outcome(pb1, 0, errTimeoutForTest())
	v1.p.outcome(pb1, 0, errTimeoutForTest())
	if !pb1.h.Load().ejected() {
		t.Fatal("B not ejected in view 1")
	}
	v1.beginStep(ShareStep)
	w.runFor(5 * time.Millisecond)
	v2.beginStep(ShareStep)
	w.runFor(5 * time.Millisecond)
	w.mustOK(t)
	pb2 := v2.p.peers[b.addr]
	if !pb2.h.Load().ejected() {
		t.Fatalf("B's ejection did not reach view 2: %+v", *pb2.h.Load())
	}
	// View 1's connection to C is lost (reconnecting); view 2's is up.
	bc := v1.p.peers[c.addr].c.(*simBackend)
	bc.connected = false
	v1.p.peers[c.addr].refresh()
	// DNS takes A out.
	sp.setDNS(sp.dnsList(map[string]bool{b.target: true, c.target: true}, nil, nil))
	_ = a
	w.runFor(time.Millisecond)
	if pb1.h.Load().ejected() {
		t.Fatal("setup: view 1 did not lift B's ejection (evLastUp)")
	}
	// Both views step: view 2 reads what view 1 published.
	v1.beginStep(ShareStep)
	w.runFor(5 * time.Millisecond)
	v2.beginStep(ShareStep)
	w.runFor(5 * time.Millisecond)
	w.mustOK(t)
	if !v2.p.peers[c.addr].c.up() {
		t.Fatal("setup: view 2's connection to C is down")
	}
	if h := pb2.h.Load(); !h.ejected() {
		t.Fatalf("view 2 has C up, yet B's ejection there was undone by view 1's local last-server-up lift (published as a verdict \"back\"): %+v", *h)
	}
}

// TestSimLastUpOnlyWhenRemoved: keepOneUp runs when a DNS change removed
// the servers up, not on every change of the set. Here nothing leaves the
// pool: A, the server up that allowed B's ejection, is reconnecting (its
// connection lost), and DNS merely adds C (still connecting): B stays
// ejected, as a lost connection alone never lifts an ejection.
func TestSimLastUpOnlyWhenRemoved(t *testing.T) {
	cfg := PoolConfig{Failures: 2, Eject: 10 * time.Second, Stall: -1}
	w, sp := simSmall(t, 3, nil, cfg, false, 1)
	v := sp.views[0]
	a, b, c := w.servers[0], w.servers[1], w.servers[2]
	sp.setDNS(sp.dnsList(map[string]bool{a.target: true, b.target: true}, nil, nil))
	w.runFor(10 * time.Millisecond)
	pb := v.p.peers[b.addr]
	v.p.outcome(pb, 0, errTimeoutForTest())
	v.p.outcome(pb, 0, errTimeoutForTest())
	if !pb.h.Load().ejected() {
		t.Fatal("B not ejected with A up")
	}
	// A's connection is lost: no server up; B stays ejected.
	pa := v.p.peers[a.addr]
	pa.c.(*simBackend).connected = false
	pa.refresh()
	if !pb.h.Load().ejected() {
		t.Fatal("setup: B's ejection lifted by A's lost connection")
	}
	// DNS adds C; nothing is removed.
	sp.setDNS(sp.dnsList(map[string]bool{a.target: true, b.target: true, c.target: true}, nil, nil))
	if v.p.peers[a.addr] != pa || v.p.peers[c.addr] == nil {
		t.Fatal("setup: the DNS change did not only add C")
	}
	if h := pb.h.Load(); !h.ejected() {
		t.Fatalf("a DNS change that removed no server (it added C) lifted B's ejection: %+v", *h)
	}
}
