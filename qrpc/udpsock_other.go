//go:build !linux

package qrpc

import (
	"net"

	"golang.org/x/net/ipv4"
)

// setRecvErr: only Linux is supported (and tested); elsewhere quic-go's
// own handling applies (a closed port is seen as a timeout).
func setRecvErr(*net.UDPConn, bool) bool { return false }

func (s *udpSocket) drainErrQueue() {}

// rawIO: Linux only (udpsock_linux.go); elsewhere net and x/net do the I/O.
type rawIO struct{}

func newRawIO(*net.UDPConn) *rawIO { return nil }

func (*rawIO) readBatch([]ipv4.Message, int) (int, error, bool) { return 0, nil, false }

func (*rawIO) readBatchNow([]ipv4.Message, int) (int, error, bool) { return 0, nil, false }

func (*rawIO) writeMsgUDP([]byte, []byte, *net.UDPAddr) (int, int, error, bool) {
	return 0, 0, nil, false
}
