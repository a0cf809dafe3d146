package qrpc

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestRefusalSharedBySameServer: a refusal one socket hears reaches the
// process's other sockets to the same server, not one to another server,
// nor one that received a datagram after the refusal was heard (its
// server is up again), nor a closed one.
func TestRefusalSharedBySameServer(t *testing.T) {
	a := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
	b := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 10}
	open := func(raddr *net.UDPAddr) *udpSocket {
		s, err := listenUDP(raddr)
		if err != nil {
			t.Fatal(err)
		}
		if !s.recvErr {
			t.Skip("no IP_RECVERR here: refusals are not heard")
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	heard, sibling, other, fresh, closed := open(a), open(a), open(b), open(a), open(a)
	_ = closed.Close()
	fresh.lastRecv.Store(mono() + int64(1<<40)) // a datagram after the refusal
	heard.shareRefusal(syscall.ECONNREFUSED)
	if ep := sibling.sendRefused.Load(); ep == nil || !errors.Is(*ep, syscall.ECONNREFUSED) {
		t.Errorf("the sibling was not told")
	}
	for name, s := range map[string]*udpSocket{"the one that heard it": heard, "another server's": other,
		"one that heard its server since": fresh, "a closed one": closed} {
		if s.sendRefused.Load() != nil {
			t.Errorf("%s was told", name)
		}
	}
}
