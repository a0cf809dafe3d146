package qrpc_test

import (
	"encoding/binary"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestICMPErrors: forged ICMP messages, as a router would send them, about
// the packets of a live connection reach its socket through the real
// kernel. Host and network unreachable are path trouble QUIC rides out:
// the connection stays up and calls keep succeeding. Port unreachable
// means the server is gone: the connection ends with "refused" (which
// also shows that the forged messages do reach the socket). Needs root
// (a raw socket); CI runs as root.
func TestICMPErrors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a raw ICMP socket")
	}
	raw, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP)
	if err != nil {
		t.Skipf("raw socket: %v", err)
	}
	defer syscall.Close(raw)
	e := newEnv(t)
	c := e.dial(t, &qrpc.Config{BackoffBase: 5 * time.Second, BackoffMax: 5 * time.Second})
	server, err := net.ResolveUDPAddr("udp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	locals := qrpc.LocalAddrsForTest(c)
	if len(locals) != 1 {
		t.Fatalf("%d connections, want 1", len(locals))
	}
	send := func(code byte) {
		t.Helper()
		msg := forgedUnreachable(code, locals[0].Port, server.Port)
		dst := &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
		if err := syscall.Sendto(raw, msg, 0, dst); err != nil {
			t.Fatal(err)
		}
	}
	call := func() error {
		_, err := unary(c, 2*time.Second, "echo", []byte("x"))
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	const hostUnreach, netUnreach, portUnreach = 1, 0, 3
	for i := range 20 {
		send([]byte{hostUnreach, netUnreach}[i%2])
		// The messages come spread among the calls, as a router's would:
		// most reach the socket between two calls, some during one. The
		// client consumes each without a trace the test can read, and
		// wherever one lands the calls must succeed, so the pause is the
		// scenario's spacing, not a wait for the kernel.
		time.Sleep(2 * time.Millisecond) // the scenario: ICMP messages 2 ms apart, between calls
		if err := call(); err != nil {
			t.Fatalf("call after ICMP unreachable %d: %v", i, err)
		}
	}
	if st := c.Stats(); st.Reconnects != 0 {
		t.Fatalf("%d reconnects after host/net unreachable, want the connection kept", st.Reconnects)
	}
	// A call in flight when port unreachable arrives: the kernel wakes
	// the socket's reader with the error, and the connection ends.
	errc := make(chan error, 1)
	go func() {
		_, err := unary(c, 5*time.Second, "block", nil)
		errc <- err
	}()
	testwait.Until(t, "call in flight", 5*time.Second, func() bool { return c.Stats().InFlight == 1 })
	send(portUnreach)
	err = <-errc
	if r := qrpc.Classify(err); r.Word != qrpc.WordConnLost || r.Reason != qrpc.ReasonRefused {
		t.Fatalf("call in flight at ICMP port unreachable: %q, want connection lost: refused", qrpc.ErrorString(err))
	}
}

// forgedUnreachable is an ICMP destination-unreachable message about a
// UDP datagram from 127.0.0.1:src to 127.0.0.1:dst.
func forgedUnreachable(code byte, src, dst int) []byte {
	inner := make([]byte, 28)
	inner[0] = 0x45 // IPv4, 20-byte header
	binary.BigEndian.PutUint16(inner[2:], 28+100)
	inner[8] = 64                          // TTL
	inner[9] = syscall.IPPROTO_UDP         // protocol
	copy(inner[12:], []byte{127, 0, 0, 1}) // source: the client
	copy(inner[16:], []byte{127, 0, 0, 1}) // destination: the server
	binary.BigEndian.PutUint16(inner[10:], inetChecksum(inner[:20]))
	binary.BigEndian.PutUint16(inner[20:], uint16(src))
	binary.BigEndian.PutUint16(inner[22:], uint16(dst))
	binary.BigEndian.PutUint16(inner[24:], 108)
	msg := append([]byte{3, code, 0, 0, 0, 0, 0, 0}, inner...)
	binary.BigEndian.PutUint16(msg[2:], inetChecksum(msg))
	return msg
}

func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
