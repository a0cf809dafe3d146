package testsrv

import (
	"net"
	"sync/atomic"
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
