package qrpc_test

import (
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// firstPeerOnly is a server socket that hears only the first client
// socket that writes to it: a client's second connection (its own
// socket) gets no answer, and its dial times out.
type firstPeerOnly struct {
	net.PacketConn
	mu    sync.Mutex
	first string
}

func (c *firstPeerOnly) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, addr, err := c.PacketConn.ReadFrom(b)
		if err != nil {
			return n, addr, err
		}
		c.mu.Lock()
		if c.first == "" {
			c.first = addr.String()
		}
		ok := c.first == addr.String()
		c.mu.Unlock()
		if ok {
			return n, addr, nil
		}
	}
}

func (c *firstPeerOnly) SetReadBuffer(n int) error {
	return c.PacketConn.(*net.UDPConn).SetReadBuffer(n)
}

func (c *firstPeerOnly) SetWriteBuffer(n int) error {
	return c.PacketConn.(*net.UDPConn).SetWriteBuffer(n)
}

// TestDialFailureReleasesConns: a Dial with several connections whose
// second connection fails closes the first: its UDP socket and its
// goroutines are gone once Dial has returned the error.
func TestDialFailureReleasesConns(t *testing.T) {
	e := newEnv(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := e.newServer()
	fp := &firstPeerOnly{PacketConn: pc}
	if err := srv.ServePacketConn(fp, qrpc.ServerTLSConfig(e.cert, nil)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	gs := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, pc.LocalAddr().String(), e.config(&qrpc.Config{Conns: 3, DialTimeout: 300 * time.Millisecond}))
	if err == nil {
		_ = c.Close()
		t.Fatal("dialled 3 connections to a server that answers one")
	}
	// Dial has returned: the first connection's socket is closed now (its
	// port can be bound again); quic-go's goroutines of a closed transport
	// end in their own time.
	fp.mu.Lock()
	first := fp.first
	fp.mu.Unlock()
	ua, _ := net.ResolveUDPAddr("udp", first)
	sock, lerr := net.ListenUDP("udp", ua)
	if lerr != nil {
		t.Fatalf("the first connection's socket %s is still open after the failed dial (%v): %v", first, err, lerr)
	}
	_ = sock.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > gs {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the failed dial, %d before:\n%s", runtime.NumGoroutine(), gs, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond) // polling a count: no event to wait on
	}
}
