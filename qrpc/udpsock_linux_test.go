package qrpc

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
)

// TestRawUDPIO: on Linux a connection's socket reads with recvmmsg and
// sends with sendmsg through raw system calls (rawIO), in both families:
// what it sends arrives, what it reads carries the sender's address (one
// *net.UDPAddr per sender), and a packet larger than the buffer is cut
// with MSG_TRUNC set, as x/net reports it.
func TestRawUDPIO(t *testing.T) {
	for _, c := range []struct{ network, host string }{{"udp4", "127.0.0.1"}, {"udp6", "::1"}} {
		t.Run(c.network, func(t *testing.T) {
			peer, err := net.ListenUDP(c.network, &net.UDPAddr{IP: net.ParseIP(c.host)})
			if err != nil {
				t.Skipf("no %s loopback: %v", c.network, err)
			}
			defer peer.Close()
			paddr := peer.LocalAddr().(*net.UDPAddr)
			s, err := listenUDP(paddr)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.raw == nil {
				t.Fatal("no raw I/O on Linux")
			}
			for i := 0; i < 3; i++ {
				n, _, err, ok := s.raw.writeMsgUDP([]byte("ping"), nil, paddr)
				if !ok || err != nil || n != 4 {
					t.Fatalf("send %d: n=%d err=%v raw=%v", i, n, err, ok)
				}
			}
			buf := make([]byte, 16)
			_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			for i := 0; i < 3; i++ {
				n, from, err := peer.ReadFromUDP(buf)
				if err != nil || string(buf[:n]) != "ping" {
					t.Fatalf("peer read %d: %q %v", i, buf[:n], err)
				}
				if _, err := peer.WriteToUDP(bytes.Repeat([]byte{byte('a' + i)}, 10+i), from); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := peer.WriteToUDP(bytes.Repeat([]byte("x"), 100), s.LocalAddr().(*net.UDPAddr)); err != nil {
				t.Fatal(err)
			}
			ms := make([]ipv4.Message, 8)
			for i := range ms {
				ms[i].Buffers = [][]byte{make([]byte, 64)}
				ms[i].OOB = make([]byte, 64)
			}
			var got []ipv4.Message
			deadline := time.Now().Add(5 * time.Second)
			for len(got) < 4 && time.Now().Before(deadline) {
				_ = s.SetReadDeadline(deadline)
				n, err, ok := s.raw.readBatch(ms, 0)
				if !ok || err != nil {
					t.Fatalf("read: %v raw=%v", err, ok)
				}
				for _, m := range ms[:n] {
					cp := m
					cp.Buffers = [][]byte{append([]byte(nil), m.Buffers[0][:m.N]...)}
					got = append(got, cp)
				}
			}
			if len(got) != 4 {
				t.Fatalf("read %d packets, want 4", len(got))
			}
			for i, m := range got[:3] {
				if want := bytes.Repeat([]byte{byte('a' + i)}, 10+i); !bytes.Equal(m.Buffers[0], want) {
					t.Errorf("packet %d: %q, want %q", i, m.Buffers[0], want)
				}
				a, ok := m.Addr.(*net.UDPAddr)
				if !ok || !a.IP.Equal(paddr.IP) || a.Port != paddr.Port {
					t.Errorf("packet %d from %v, want %v", i, m.Addr, paddr)
				}
				if m.Addr != got[0].Addr {
					t.Errorf("packet %d: a new *net.UDPAddr for the same sender", i)
				}
			}
			if last := got[3]; last.N != 64 || last.Flags&msgTrunc == 0 {
				t.Errorf("100 bytes into 64: N=%d flags=%#x, want 64 with MSG_TRUNC", last.N, last.Flags)
			}
		})
	}
}

const msgTrunc = 0x20 // MSG_TRUNC
