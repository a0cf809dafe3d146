package qrpc

import (
	"net"
	"sync"
	"time"
)

// A server's host answers a packet to a closed port with ICMP port
// unreachable at a limited rate (Linux: per destination host a burst of
// 6, then one a second, net.ipv4.icmp_ratelimit; loopback is exempt), so
// of many quiet connections to a killed server only a few hear it from
// their probes, and the others would wait for their deadlines. A refusal
// says nothing listens on the server's address and port, and a QUIC
// connection lives in the server's process: every connection to that
// address whose server has not been heard from since is dead with it.
// So the socket that hears a refusal passes it to the process's other
// sockets to the same address (shareRefusal); each hands it to quic-go
// as one it met itself (after the same grace, so that a CONNECTION_CLOSE
// queued ahead of it goes first). A socket that received a datagram
// after the refusal was heard is left alone: its server is up again (a
// restart on the same port), and only its own packets can tell.

// sameServer holds the client sockets by their server's address.
var sameServer = struct {
	mu sync.Mutex
	m  map[string]map[*udpSocket]struct{}
}{m: map[string]map[*udpSocket]struct{}{}}

// mono is now on the monotonic clock, as an integer an atomic holds.
func mono() int64 { return monoNS(time.Now()) }

// join lists s among the sockets to raddr.
func (s *udpSocket) join(raddr *net.UDPAddr) {
	s.peerKey = raddr.String()
	sameServer.mu.Lock()
	defer sameServer.mu.Unlock()
	set := sameServer.m[s.peerKey]
	if set == nil {
		set = map[*udpSocket]struct{}{}
		sameServer.m[s.peerKey] = set
	}
	set[s] = struct{}{}
}

// Close takes s off its server's list before closing it.
func (s *udpSocket) Close() error {
	if s.peerKey != "" {
		sameServer.mu.Lock()
		if set := sameServer.m[s.peerKey]; set != nil {
			delete(set, s)
			if len(set) == 0 {
				delete(sameServer.m, s.peerKey)
			}
		}
		sameServer.mu.Unlock()
	}
	return s.UDPConn.Close()
}

// shareRefusal passes a refusal s heard itself to the other sockets to
// its server that have received nothing since.
func (s *udpSocket) shareRefusal(err error) {
	if s.peerKey == "" {
		return
	}
	at := mono()
	sameServer.mu.Lock()
	set := sameServer.m[s.peerKey]
	others := make([]*udpSocket, 0, len(set))
	for o := range set {
		if o != s {
			others = append(others, o)
		}
	}
	sameServer.mu.Unlock()
	for _, o := range others {
		if o.lastRecv.Load() < at {
			o.toldRefused(err)
		}
	}
}

// toldRefused hands s's reader a refusal another socket heard, as send
// does one it met: the read path gives it to quic-go after the grace.
func (s *udpSocket) toldRefused(err error) {
	if s.sendRefused.CompareAndSwap(nil, &err) {
		s.shared.Add(1)
		_ = s.UDPConn.SetReadDeadline(time.Now())
	}
}
