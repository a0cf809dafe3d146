package qrpc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"

	"golang.org/x/net/ipv4"
)

// udpSocket is the UDP socket of one client connection, handed to quic-go
// as its transport's packet conn.
//
// A server that is killed leaves its port closed: the server's host answers
// each packet with ICMP port unreachable. quic-go's own sockets never hear
// of it (Linux reports ICMP errors to an unconnected UDP socket only with
// IP_RECVERR set): without it, calls on the dead connection wait their whole
// timeout, and a pool keeps sending new ones there until enough have failed.
// With IP_RECVERR the next read returns ECONNREFUSED about a round trip
// after the first packet sent to the dead port; passed to quic-go, it
// closes the transport and the connection, failing the calls in flight at
// once ("connection lost: refused") and letting a pool send the others
// elsewhere. A dial to a closed port fails the same way ("connect:
// refused") instead of after the handshake timeout.
//
// The other ICMP errors (host or network unreachable, fragmentation needed
// for a path MTU probe) are path trouble that QUIC rides out by itself, as
// it did without IP_RECVERR: ReadBatch drops them and reads on.
type udpSocket struct {
	*net.UDPConn
	batch   *ipv4.PacketConn
	raw     *rawIO // nil: batch and UDPConn do the I/O
	recvErr bool   // IP_RECVERR (or IPV6_RECVERR) is set
	// refused is a refusal held back while the datagrams queued before
	// it are read (ReadBatch; quic-go's one read loop is its only user).
	refused error
	// conn is the connection once dialled: a refusal waits for it to
	// end by itself (refusal).
	conn atomic.Pointer[quic.Conn]
	// sendRefused is a refusal a send met (WriteMsgUDP), for the read
	// path to hand to quic-go as it does its own.
	sendRefused atomic.Pointer[error]
	// sends counts quic-go's datagrams: the probes (qconn.probeTick) go
	// out only when it sent nothing for a while. probes counts those.
	sends  atomic.Uint64
	probes atomic.Uint64
	raddr  *net.UDPAddr // the server: where probes go
	// peerKey is raddr's key in sameServer ("" for a server's socket);
	// lastRecv is when a datagram last came (mono); shared counts the
	// refusals other sockets to the server passed on (udpsock_share.go).
	peerKey  string
	lastRecv atomic.Int64
	shared   atomic.Uint64
}

// refusalGrace bounds how long a refusal waits before it reaches
// quic-go. A server that closes sends CONNECTION_CLOSE before its port
// closes, but quic-go's connection handles a packet in its own goroutine,
// after the read loop has handed it on: a refusal read at once closes
// the transport, and the connection's loop picks the transport's close
// or the queued packet at random, ending "refused" instead of "closed by
// server" with the server's reason (seen under the race detector with
// another suite loading the CPUs). Waiting until the
// connection ends lets it handle the packet first; a killed server,
// which sent no CONNECTION_CLOSE, is found this much later.
const refusalGrace = 50 * time.Millisecond

// refusal returns err once the connection has ended or refusalGrace has
// passed.
func (s *udpSocket) refusal(err error) error {
	var done <-chan struct{}
	if c := s.conn.Load(); c != nil {
		done = c.Context().Done()
	}
	t := time.NewTimer(refusalGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	return err
}

// listenUDP opens the socket for a connection to raddr, in raddr's family.
func listenUDP(raddr *net.UDPAddr) (*udpSocket, error) {
	network, laddr := "udp4", &net.UDPAddr{IP: net.IPv4zero}
	if raddr.IP.To4() == nil {
		network, laddr = "udp6", &net.UDPAddr{IP: net.IPv6unspecified}
	}
	uc, err := net.ListenUDP(network, laddr)
	if err != nil {
		return nil, fmt.Errorf("listen udp: %w", err)
	}
	s := newUDPSocket(uc)
	s.recvErr = setRecvErr(uc, network == "udp6")
	s.raddr = raddr
	if s.recvErr {
		s.join(raddr)
	}
	return s, nil
}

// newUDPSocket wraps uc for quic-go: batched reads and, on Linux, raw
// system calls (rawIO). IP_RECVERR is the client's (listenUDP).
func newUDPSocket(uc *net.UDPConn) *udpSocket {
	return &udpSocket{UDPConn: uc, batch: ipv4.NewPacketConn(uc), raw: newRawIO(uc)}
}

// ReadBatch is what quic-go reads with when the conn offers it (in place of
// its own ipv4.PacketConn over the same socket): it sees each ICMP error
// first.
func (s *udpSocket) ReadBatch(ms []ipv4.Message, flags int) (n int, err error) {
	// quic-go's read loop calls this: a panic here would end the process;
	// it ends the transport (and its connection) instead.
	defer safego.Recover("socket", func() { n, err = 0, errCallbackPanic })
	if s.raddr != nil { // a client's: a test's servers share its process
		safego.Inject("socket")
	}
	return s.readBatchChecked(ms, flags)
}

func (s *udpSocket) readBatchChecked(ms []ipv4.Message, flags int) (int, error) {
	if err := s.refused; err != nil {
		s.refused = nil
		return 0, s.refusal(err)
	}
	if ep := s.sendRefused.Swap(nil); ep != nil {
		return s.heardOnSend(*ep, ms, flags)
	}
	for {
		n, err := s.readBatch(ms, flags)
		if err == nil && n > 0 {
			s.lastRecv.Store(mono())
		}
		if err == nil || !s.recvErr {
			return n, err
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Woken by WriteMsgUDP for a refusal it met; quic-go's own
			// deadline (closing) passes through.
			if ep := s.sendRefused.Swap(nil); ep != nil {
				return s.heardOnSend(*ep, ms, flags)
			}
			return n, err
		}
		var errno syscall.Errno
		if !errors.As(err, &errno) || !isICMPErrno(errno) {
			return n, err
		}
		// Each ICMP error is also queued on the socket's error queue,
		// charged to its receive buffer: drain it, or enough of them
		// would crowd out the packets.
		s.drainErrQueue()
		if errno == syscall.ECONNREFUSED {
			s.shareRefusal(err)
			// The kernel reports the refusal before the datagrams queued
			// ahead of it: a server's CONNECTION_CLOSE, sent before its
			// port closed, goes to quic-go first (the connection ends
			// "closed by server", with the server's reason), the refusal
			// at the next read.
			if m, rerr := s.readQueued(ms, flags); rerr == nil && m > 0 {
				s.refused = err
				return m, nil
			}
			return n, s.refusal(err)
		}
		if n > 0 {
			return n, nil
		}
		// Transient path trouble: the kernel cleared the error when it
		// reported it; read on. Each turn consumes one ICMP message, so
		// this ends with them.
	}
}

// WriteMsgUDP is how quic-go sends. A send also reports (and clears) an
// ICMP error pending on the socket, without sending. A refusal goes to the
// read path, which hands it to quic-go after the same grace as one it read
// itself (quic-go ends a connection at once on a send error: a server's
// CONNECTION_CLOSE queued for it would be lost, and its reason with it);
// the datagram is sent again once, as after a transient error. A genuine
// local error (EMSGSIZE for a packet over the interface's MTU) comes back
// the same the second time, for quic-go to handle.
func (s *udpSocket) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error) {
	// quic-go's connection loop calls this: a panic here would end the
	// process; it ends the connection (a send error) instead.
	defer safego.Recover("socket", func() { n, oobn, err = 0, 0, errCallbackPanic })
	s.sends.Add(1)
	return s.send(b, oob, addr)
}

func (s *udpSocket) send(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	n, oobn, err := s.writeMsgUDP(b, oob, addr)
	if err == nil || !s.recvErr {
		return n, oobn, err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) || !isICMPErrno(errno) {
		return n, oobn, err
	}
	s.drainErrQueue()
	if errno == syscall.ECONNREFUSED {
		refusal := err
		s.shareRefusal(err)
		s.sendRefused.CompareAndSwap(nil, &refusal)
		// The reader may wait in the netpoller for a datagram that
		// will not come: a deadline in the past wakes it.
		_ = s.UDPConn.SetReadDeadline(time.Now())
		n, oobn, err = s.writeMsgUDP(b, oob, addr)
		if errors.Is(err, syscall.ECONNREFUSED) {
			// Another ICMP error came meanwhile; the read path has the
			// refusal, and the datagram counts as lost.
			return len(b), len(oob), nil
		}
		return n, oobn, err
	}
	return s.writeMsgUDP(b, oob, addr)
}

// heardOnSend is ReadBatch for a refusal a send met: what is queued goes
// to quic-go first (a server's CONNECTION_CLOSE sent before its port
// closed), then the refusal, after the grace (refusal).
func (s *udpSocket) heardOnSend(err error, ms []ipv4.Message, flags int) (int, error) {
	_ = s.UDPConn.SetReadDeadline(time.Time{})
	if m, rerr := s.readQueued(ms, flags); rerr == nil && m > 0 {
		s.refused = err
		return m, nil
	}
	return 0, s.refusal(err)
}

// probe sends the server a datagram its QUIC stack drops without a word
// (one byte whose two high bits are clear: not QUIC, RFC 9000 17.2 and
// RFC 9443; far below the 21 bytes a stateless reset answers) and a closed
// port answers with ICMP port unreachable: a connection whose calls wait
// quietly for their answers hears of a killed server a round trip later.
func (s *udpSocket) probe() {
	if s.raddr == nil {
		return
	}
	s.probes.Add(1)
	_, _, _ = s.send(probeDatagram[:], nil, s.raddr)
}

var probeDatagram = [1]byte{0}

// readQueued reads what is queued on the socket, without waiting (0 when
// nothing is, or the socket has no way to read without waiting).
func (s *udpSocket) readQueued(ms []ipv4.Message, flags int) (int, error) {
	if s.raw == nil {
		return 0, nil
	}
	n, err, ok := s.raw.readBatchNow(ms, flags)
	if !ok {
		return 0, nil
	}
	return n, err
}

func (s *udpSocket) readBatch(ms []ipv4.Message, flags int) (int, error) {
	if s.raw != nil {
		if n, err, ok := s.raw.readBatch(ms, flags); ok {
			return n, err
		}
	}
	return s.batch.ReadBatch(ms, flags)
}

func (s *udpSocket) writeMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	if s.raw != nil {
		if n, oobn, err, ok := s.raw.writeMsgUDP(b, oob, addr); ok {
			return n, oobn, err
		}
	}
	return s.UDPConn.WriteMsgUDP(b, oob, addr)
}

// isICMPErrno reports the errors Linux maps ICMP destination-unreachable,
// time-exceeded and parameter-problem messages to (icmp_err_convert).
func isICMPErrno(e syscall.Errno) bool {
	switch e {
	case syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH,
		syscall.EMSGSIZE, syscall.ENOPROTOOPT, syscall.EOPNOTSUPP,
		syscall.ENONET, syscall.EACCES, syscall.EPROTO, syscall.EHOSTDOWN:
		return true
	}
	return false
}
