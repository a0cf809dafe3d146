package qrpc_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// env is a server with a CA-signed certificate for 127.0.0.1/localhost.
type env struct {
	ca   *certs.CA
	srv  *qrpc.Server
	addr string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ca, err := certs.NewCA("test ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(certs.Options{Hosts: []string{"localhost", "127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	srv := qrpc.NewServer(nil)
	srv.Handle("echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		resp.Headers = req.Headers
		resp.Body = req.Body
	})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(cert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return &env{ca: ca, srv: srv, addr: a.String()}
}

func (e *env) dial(t testing.TB, cfg *qrpc.Config) *qrpc.Client {
	t.Helper()
	if cfg == nil {
		cfg = &qrpc.Config{}
	}
	if cfg.CAPEM == nil {
		cfg.CAPEM = e.ca.CertPEM
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, e.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestSmokeRoundTrip(t *testing.T) {
	e := newEnv(t)
	c := e.dial(t, nil)
	for _, n := range []int{0, 100, 4 << 10, 64 << 10, 4 << 20} {
		body := bytes.Repeat([]byte("x"), n)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := c.Unary(ctx, "echo", body, []byte("k"), []byte("v"))
		cancel()
		if err != nil {
			t.Fatalf("%d: %v", n, err)
		}
		if !bytes.Equal(resp.Body, body) || resp.Code != 0 || len(resp.Headers) != 2 {
			t.Fatalf("%d: bad response: code %d, %d bytes, headers %q", n, resp.Code, len(resp.Body), resp.Headers)
		}
	}
}
