package testsrv

import (
	"context"
	"net"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// MutePacketConn is a server's socket that can go silent with its port
// still open, as for a frozen process (SIGSTOP) or a network partition:
// muted, it drops what it reads and sends nothing, so the client hears
// nothing at all (closing the socket instead is a kill: the kernel then
// answers ICMP port unreachable, which clients hear). As a plain
// net.PacketConn it makes quic-go read one packet at a time, which is all
// a test needs. PacketConn must be a *net.UDPConn.
type MutePacketConn struct {
	net.PacketConn
	muted atomic.Bool
}

// Mute silences the socket (true) or lets it speak again (false).
func (c *MutePacketConn) Mute(on bool) { c.muted.Store(on) }

func (c *MutePacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, addr, err := c.PacketConn.ReadFrom(b)
		if err != nil || !c.muted.Load() {
			return n, addr, err
		}
	}
}

func (c *MutePacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if c.muted.Load() {
		return len(b), nil
	}
	return c.PacketConn.WriteTo(b, addr)
}

// SetReadBuffer and SetWriteBuffer let quic-go size the buffers (and not
// warn that it cannot).
func (c *MutePacketConn) SetReadBuffer(n int) error {
	return c.PacketConn.(*net.UDPConn).SetReadBuffer(n)
}

func (c *MutePacketConn) SetWriteBuffer(n int) error {
	return c.PacketConn.(*net.UDPConn).SetWriteBuffer(n)
}

// ListenReusePort opens a UDP socket on addr with SO_REUSEPORT, so that a
// second server can bind the same port before the first one's socket is
// closed: a server replaced with no moment where the port is closed (in
// which the kernel would answer ICMP port unreachable, and clients would
// see "refused" instead of what the test is after).
func ListenReusePort(addr string) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp", addr)
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}
