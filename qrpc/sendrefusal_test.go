package qrpc

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// TestRefusalMetBySend: an ICMP port unreachable that a send meets first
// (the kernel reports a pending socket error to the next sendmsg, which
// then sends nothing) reaches quic-go the way one the reader meets does:
// through the read path, after the refusal's grace, while the send itself
// goes out again and reports no error. An error from the send would make
// quic-go end the connection at once, before a CONNECTION_CLOSE of the
// server queued behind it could be read.
func TestRefusalMetBySend(t *testing.T) {
	// A port that was open and is closed now: the kernel answers with
	// ICMP port unreachable.
	peer, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	dead := peer.LocalAddr().(*net.UDPAddr)
	_ = peer.Close()
	s, err := listenUDP(dead)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.recvErr {
		t.Skip("no IP_RECVERR")
	}
	// The first datagram brings the refusal back; wait until it is
	// pending on the socket (POLLERR), as it is when quic-go sends next.
	if _, _, err := s.writeMsgUDP([]byte("first"), nil, dead); err != nil {
		t.Fatal(err)
	}
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "the refusal pending on the socket", 10*time.Second, func() bool {
		var revents int16
		_ = rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, _ := unix.Poll(fds, 0); n > 0 {
				revents = fds[0].Revents
			}
		})
		return revents&unix.POLLERR != 0
	})

	if _, _, err := s.WriteMsgUDP([]byte("second"), nil, dead); err != nil {
		t.Fatalf("the send that met the refusal returned %v to quic-go, which would end the connection at once", err)
	}
	ms := []ipv4.Message{{Buffers: [][]byte{make([]byte, 1500)}, OOB: make([]byte, 64)}}
	got := make(chan error, 1)
	t0 := time.Now()
	go func() {
		_, err := s.ReadBatch(ms, 0)
		got <- err
	}()
	select {
	case err := <-got:
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("the read after the send: %v, want the refusal", err)
		}
		if d := time.Since(t0); d < refusalGrace {
			t.Fatalf("the refusal came after %v, before its grace (%v)", d, refusalGrace)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader never heard of the refusal the send met")
	}
}
