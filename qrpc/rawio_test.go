//go:build linux

package qrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestRawSocketsBothFamilies: on Linux the server's Listen socket and the
// client's connection sockets do their I/O with raw system calls (so that
// they do not wake Go's sysmon), in the socket's own family, and calls go
// through over IPv4 and IPv6.
func TestRawSocketsBothFamilies(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct{ listen, want string }{{"127.0.0.1:0", "udp4"}, {"[::1]:0", "udp6"}} {
		t.Run(c.want, func(t *testing.T) {
			srv := e.newServer()
			addr, err := srv.Listen(c.listen, qrpc.ServerTLSConfig(e.cert, nil))
			if err != nil {
				t.Skipf("listen %s: %v", c.listen, err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl, err := qrpc.Dial(ctx, addr.String(), e.config(&qrpc.Config{ServerName: "localhost"}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cl.Close() })
			for i := 0; i < 20; i++ {
				resp, err := unary(cl, 5*time.Second, "echo", []byte("raw"))
				if err != nil || string(resp.Body) != "raw" {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			server, client := qrpc.RawNetworksForTest(srv, cl)
			if server != c.want || len(client) == 0 {
				t.Fatalf("raw I/O: server %q, client %q; want %s on both", server, client, c.want)
			}
			for _, n := range client {
				if n != c.want {
					t.Fatalf("raw I/O: client sockets %q, want %s", client, c.want)
				}
			}
		})
	}
}
