package qrpc

import (
	"net"
	"syscall"
)

// setRecvErr asks for ICMP errors on the socket (see udpSocket). An IPv6
// socket gets both options: IPv4-mapped peers are reported by the IPv4 side.
func setRecvErr(uc *net.UDPConn, v6 bool) bool {
	rc, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = rc.Control(func(fd uintptr) {
		if v6 {
			ok = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_RECVERR, 1) == nil
			_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1)
			return
		}
		ok = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1) == nil
	})
	return ok
}

// drainErrQueue empties the socket's error queue (at most 64 entries a
// turn: ICMP arrives rate-limited, and the next error comes back here).
func (s *udpSocket) drainErrQueue() {
	rc, err := s.SyscallConn()
	if err != nil {
		return
	}
	var buf [256]byte
	var oob [256]byte
	_ = rc.Control(func(fd uintptr) {
		for i := 0; i < 64; i++ {
			_, _, _, _, err := syscall.Recvmsg(int(fd), buf[:], oob[:], syscall.MSG_ERRQUEUE|syscall.MSG_DONTWAIT)
			if err != nil {
				return
			}
		}
	})
}
