package qrpc_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
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

// rawServer is a bare quic-go listener speaking ALPN qrpc with the env's
// certificate; onConn runs for every connection it accepts.
func rawServer(t *testing.T, e *env, onConn func(*quic.Conn)) string {
	t.Helper()
	// A transport of our own, closed in the cleanup: a listener from
	// quic.ListenAddr keeps its transport (and its goroutines) until its
	// last connection's state is gone, which outlived the goroutine check
	// (15 s) twice on a loaded machine.
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	ln, err := tr.Listen(&tls.Config{
		Certificates: []tls.Certificate{e.cert}, NextProtos: []string{qrpc.ALPN},
	}, &quic.Config{MaxIdleTimeout: 5 * time.Second})
	if err != nil {
		_ = pc.Close()
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				onConn(c)
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		_ = tr.Close() // closes its connections: the handlers return
		wg.Wait()
		_ = pc.Close()
	})
	return ln.Addr().String()
}

// answerEach reads each request on each stream of c and replies with the
// bytes reply returns for it (written raw, no framing added).
func answerEach(c *quic.Conn, reply func(req *qrpcpb.Request) []byte) {
	codec := frame.New(0)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := c.AcceptStream(c.Context())
		if err != nil {
			return
		}
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
				if _, err := st.Write(reply(&req)); err != nil {
					return
				}
			}
		}()
	}
}

func hdr(l uint32, flag byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, l)
	return append(b, flag)
}

// rleBomb is a zstd frame with no declared size whose RLE blocks expand 4
// bytes to 128 KiB each: 32 KiB that decode to total bytes.
func rleBomb(total int) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, (17 - 10) << 3} // no content size, 128 KiB window
	for total > 0 {
		n := min(total, 128<<10)
		total -= n
		h := uint32(1<<1) | uint32(n)<<3
		if total == 0 {
			h |= 1
		}
		b = append(b, byte(h), byte(h>>8), byte(h>>16), 'A')
	}
	return b
}

// TestHostileServer: whatever a server sends back, the call ends with a
// clear error, the client does not panic, and memory stays bounded.
func TestHostileServer(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	resp := func(req *qrpcpb.Request, flag byte, payload []byte) []byte {
		return append(hdr(uint32(len(payload)+1), flag), payload...)
	}
	cases := []struct {
		name  string
		reply func(req *qrpcpb.Request) []byte
		want  string // in the error message
	}{
		{"oversized length prefix", func(*qrpcpb.Request) []byte {
			// Promise 4 GiB and send 1 MiB of it.
			return append(hdr(0xfffffff0, frame.FlagResponse), make([]byte, 1<<20)...)
		}, "frame too large"},
		{"unknown flag", func(req *qrpcpb.Request) []byte {
			p, _ := (&qrpcpb.Response{RequestId: req.RequestId}).MarshalVT()
			return resp(req, 9, p)
		}, "unknown frame flag"},
		{"garbage protobuf", func(req *qrpcpb.Request) []byte {
			return resp(req, frame.FlagResponse, []byte{0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f, 'x'})
		}, "bad response"},
		{"zstd bomb 32KB to 1GB", func(req *qrpcpb.Request) []byte {
			return resp(req, frame.FlagResponseZstd, rleBomb(1<<30))
		}, "decompressed payload too large"},
		{"zstd declaring 1GB", func(req *qrpcpb.Request) []byte {
			z := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xc0, (17 - 10) << 3}
			z = binary.LittleEndian.AppendUint64(z, 1<<30)
			return resp(req, frame.FlagResponseZstd, append(z, rleBomb(1 << 20)[6:]...))
		}, "decompressed payload too large"},
		{"not zstd", func(req *qrpcpb.Request) []byte {
			return resp(req, frame.FlagResponseZstd, []byte("this is not zstd"))
		}, "bad zstd payload"},
		{"request frame from the server", func(req *qrpcpb.Request) []byte {
			p, _ := req.MarshalVT()
			return resp(req, frame.FlagRequest, p)
		}, "server sent a frame of kind"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := rawServer(t, e, func(c *quic.Conn) { answerEach(c, tc.reply) })
			cfg := e.config(&qrpc.Config{Streams: 2, BackoffBase: 10 * time.Second})
			c, err := qrpc.Dial(t.Context(), addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var callErr error
			used := allocatedDuring(func() {
				_, callErr = unary(c, 5*time.Second, "echo", []byte("hi"))
			})
			if !errors.Is(callErr, qrpc.ErrConnLost) || !errors.Is(callErr, qrpc.ErrProtocol) {
				t.Fatalf("err %v, want ErrConnLost and ErrProtocol", callErr)
			}
			if !strings.Contains(callErr.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", callErr, tc.want)
			}
			if used > 16<<20 {
				t.Fatalf("the call allocated %d MiB", used>>20)
			}
			t.Logf("%v; %.1f MiB allocated", callErr, float64(used)/(1<<20))
		})
	}
}

// allocatedDuring is the process's heap allocation while f runs (servers
// included, so an upper bound for the client).
func allocatedDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestResponseForUnknownIDDropped: a response nobody waits for is dropped,
// the call it was not for still times out, and the connection lives on.
func TestResponseForUnknownIDDropped(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	addr := rawServer(t, e, func(c *quic.Conn) {
		answerEach(c, func(req *qrpcpb.Request) []byte {
			id := req.RequestId + 1000
			if string(req.Body) == "right" {
				id = req.RequestId
			}
			p, _ := (&qrpcpb.Response{RequestId: id, Body: req.Body}).MarshalVT()
			return append(hdr(uint32(len(p)+1), frame.FlagResponse), p...)
		})
	})
	c, err := qrpc.Dial(t.Context(), addr, e.config(&qrpc.Config{Streams: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := unary(c, 200*time.Millisecond, "echo", []byte("wrong")); !errors.Is(err, qrpc.ErrTimeout) {
		t.Fatalf("err %v, want ErrTimeout", err)
	}
	if resp, err := unary(c, 2*time.Second, "echo", []byte("right")); err != nil || string(resp.Body) != "right" {
		t.Fatalf("after a stray response: %v", err)
	}
}

// TestSilentServer: a server that completes the handshake, takes the
// streams and then says nothing. The call's deadline fires and frees its slot.
func TestSilentServer(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	addr := rawServer(t, e, func(c *quic.Conn) {
		for {
			st, err := c.AcceptStream(c.Context())
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, st) }() // reads, never answers
		}
	})
	c, err := qrpc.Dial(t.Context(), addr, e.config(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	_, err = unary(c, 300*time.Millisecond, "echo", []byte("anyone?"))
	if !errors.Is(err, qrpc.ErrTimeout) {
		t.Fatalf("err %v, want ErrTimeout", err)
	}
	if d := time.Since(began); d < 250*time.Millisecond || d > 2*time.Second {
		t.Fatalf("deadline of 300ms fired after %v", d)
	}
	if n := c.Stats().InFlight; n != 0 {
		t.Fatalf("InFlight %d after the timeout", n)
	}
	// Many calls, all timing out, leave nothing behind.
	var wg sync.WaitGroup
	var timeouts atomic.Int64
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := unary(c, 100*time.Millisecond, "echo", nil); errors.Is(err, qrpc.ErrTimeout) {
				timeouts.Add(1)
			}
		}()
	}
	wg.Wait()
	if timeouts.Load() != 200 || c.Stats().InFlight != 0 {
		t.Fatalf("%d of 200 timed out; InFlight %d", timeouts.Load(), c.Stats().InFlight)
	}
}

// TestFlappingServerBackoff: a server that accepts and drops every
// connection at once must not be re-dialled in a tight loop.
func TestFlappingServerBackoff(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	var mu sync.Mutex
	var accepts []time.Time
	addr := rawServer(t, e, func(c *quic.Conn) {
		mu.Lock()
		accepts = append(accepts, time.Now())
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // the scenario: up for 20 ms, then dropped
		_ = c.CloseWithError(0, "go away")
	})
	const base = 100 * time.Millisecond
	c, err := qrpc.Dial(t.Context(), addr, e.config(&qrpc.Config{Streams: 1, BackoffBase: base, BackoffMax: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	n := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(accepts))
	}
	testwait.Until(t, "5 connections", 30*time.Second, func() bool { return n() >= 5 })
	_ = c.Close()
	// The first re-dial is at once (the connection was up); then each
	// waits its backoff, base × 1.6^k less 20 % at most: from the 2nd
	// connection to the 5th, at least 0.8 × (100 + 160 + 256) ms. A tight
	// loop would take a few milliseconds; a slow machine only adds time.
	mu.Lock()
	took := accepts[4].Sub(accepts[1])
	mu.Unlock()
	if least := time.Duration(0.8 * float64(base) * (1 + 1.6 + 1.6*1.6)); took < least {
		t.Fatalf("connections 2 to 5 came %v apart, want at least %v (backoff)", took, least)
	}
	t.Logf("connections 2 to 5 came %v apart", took)
}

// TestHostileClient: the server survives what a hostile client sends. A
// frame it cannot parse closes that stream only; a well-framed garbage
// message is skipped and the stream stays usable.
func TestHostileClient(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	conn, err := quic.DialAddr(t.Context(), e.addr, &tls.Config{RootCAs: e.ca.Pool(), NextProtos: []string{qrpc.ALPN}, ServerName: "127.0.0.1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	codec := frame.New(0)
	echo := func(st *quic.Stream, id uint64) error {
		b, err := codec.AppendRequest(nil, frame.KindRequest, &qrpcpb.Request{RequestId: id, Method: []byte("echo"), Body: []byte("ok")})
		if err != nil {
			return err
		}
		if _, err := st.Write(b); err != nil {
			return err
		}
		_ = st.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, p, err := codec.NewReader(st).Next()
		if err != nil {
			return err
		}
		var resp qrpcpb.Response
		if err := resp.UnmarshalVT(p); err != nil || resp.RequestId != id || string(resp.Body) != "ok" {
			return errors.New("bad echo")
		}
		return nil
	}
	attacks := []struct {
		name        string
		send        []byte
		streamLives bool
	}{
		{"oversized length prefix", append(hdr(0xfffffff0, frame.FlagRequest), make([]byte, 64<<10)...), false},
		{"unknown flag", append(hdr(3, 0x42), 0x18, 0x01), false},
		{"zstd bomb", append(hdr(uint32(len(rleBomb(1<<30))+1), frame.FlagRequestZstd), rleBomb(1<<30)...), false},
		{"garbage protobuf", append(hdr(6, frame.FlagRequest), 0x1a, 0xff, 0xff, 0xff, 0x0f), true},
		{"response frame from a client", append(hdr(3, frame.FlagResponse), 0x18, 0x01), true},
	}
	for i, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			st, err := conn.OpenStreamSync(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			used := allocatedDuring(func() {
				// The server may reset the stream while we still write.
				if _, err = st.Write(a.send); err == nil {
					err = echo(st, uint64(i+1))
				}
			})
			if a.streamLives && err != nil {
				t.Fatalf("stream should survive: %v", err)
			}
			if !a.streamLives {
				var se *quic.StreamError
				if !errors.As(err, &se) {
					t.Fatalf("stream should be reset by the server, got %v", err)
				}
			}
			if used > 16<<20 {
				t.Fatalf("%d MiB allocated", used>>20)
			}
			// The connection, and the server, carry on.
			st2, err := conn.OpenStreamSync(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := echo(st2, 1000+uint64(i)); err != nil {
				t.Fatalf("fresh stream after the attack: %v", err)
			}
		})
	}
}
