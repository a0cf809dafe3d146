package qrpc_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
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
	if !testwait.For(5*time.Second, func() bool { return runtime.NumGoroutine() <= gs }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after the failed dial, %d before:\n%s", runtime.NumGoroutine(), gs, buf[:runtime.Stack(buf, true)])
	}
}

// TestStreamReopenRetried: a stream the server reset is replaced even when
// the first attempts to open its replacement fail (the server gives its
// stream credit back late): the client tries again, and the connection
// gets back to its full count of streams.
func TestStreamReopenRetried(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	// Four streams, and credit comes back only when the test releases it.
	ln, err := tr.Listen(&tls.Config{Certificates: []tls.Certificate{e.cert}, NextProtos: []string{qrpc.ALPN}},
		&quic.Config{MaxIdleTimeout: 5 * time.Second, MaxIncomingStreams: 4, RequireStreamCreditRelease: true})
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	held := make(chan *quic.Stream, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept(t.Context())
		if err != nil {
			return
		}
		codec := frame.New(0)
		for {
			st, err := c.AcceptStream(c.Context())
			if err != nil {
				return
			}
			accepted.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := codec.NewReader(st)
				for {
					_, p, err := r.Next()
					if err != nil {
						return
					}
					var req qrpcpb.Request
					if err := req.UnmarshalVT(p); err != nil {
						return
					}
					if string(req.Method) == "reset" {
						st.CancelRead(7)
						st.CancelWrite(7)
						held <- st
						return
					}
					b, _ := codec.AppendResponse(nil, &qrpcpb.Response{RequestId: req.RequestId, Body: req.Body})
					if _, err := st.Write(b); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		_ = tr.Close()
		wg.Wait()
		_ = pc.Close()
	})
	logs := &logCapture{}
	c := dialAddr(t, e, ln.Addr().String(), &qrpc.Config{Streams: 4, DialTimeout: 200 * time.Millisecond,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Logger: slog.New(logs)})
	if _, err := unary(c, 5*time.Second, "reset", nil); !errors.Is(err, qrpc.ErrConnLost) {
		t.Fatalf("reset call: %v, want connection lost", err)
	}
	testwait.Until(t, "a failed reopen", 10*time.Second, func() bool {
		return logs.count("qrpc cannot reopen a stream, retrying", "") > 0
	})
	(<-held).ReleaseStreamCredit()
	// The server hears of a stream with its first frame: calls go round
	// the streams until one lands on the new one.
	testwait.Until(t, "the stream reopened (a 5th stream accepted)", 10*time.Second, func() bool {
		for range 64 {
			if _, err := unary(c, 5*time.Second, "echo", []byte("x")); err != nil {
				t.Fatalf("call after the reset: %v", err)
			}
		}
		return accepted.Load() == 5
	})
}
