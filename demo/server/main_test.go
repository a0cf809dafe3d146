package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

func startDemo(t *testing.T, dir string) *instance {
	t.Helper()
	o, err := parseFlags([]string{"-addr", "127.0.0.1:0", "-mtls-addr", "127.0.0.1:0", "-certs-dir", dir, "-max-sleep", "300ms"})
	if err != nil {
		t.Fatal(err)
	}
	in, err := start(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.close)
	return in
}

func readFile(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func dial(t *testing.T, addr string, cfg *qrpc.Config) (*qrpc.Client, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, addr, cfg)
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

func unary(t *testing.T, c *qrpc.Client, method, body string, headers ...[]byte) *qrpc.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Unary(ctx, method, []byte(body), headers...)
	if err != nil {
		t.Fatalf("%s(%q): %v", method, body, err)
	}
	return r
}

func TestMethods(t *testing.T) {
	dir := t.TempDir()
	in := startDemo(t, dir)
	c, err := dial(t, in.addr, &qrpc.Config{CAPEM: readFile(t, dir, fileCA)})
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		method, body string
		code         uint32
		want         string
	}{
		{"greet", "nginx", 0, "Hello nginx!"},
		{"greet", "", 0, "Hello world!"},
		{"echo", "some bytes\x00\xff", 0, "some bytes\x00\xff"},
		{"slow", "20", 0, "slept 20 ms"},
		{"slow", "999999", 0, "slept 300 ms"}, // capped by -max-sleep
		{"slow", "soon", codeBadRequest, "slow: body must be a non-negative number of milliseconds"},
		{"fail", "", codeFailDefault, "failed on purpose with code 1"},
		{"fail", "42", 42, "failed on purpose with code 42"},
		{"fail", "0", codeBadRequest, "fail: body must be a non-zero code"},
		{"route", "blue.example.test", 0, "blue"},
		{"route", "Green.example.test", 0, "green"},
		{"route", "", 0, "green"},
		{"route", "red.example.test", 0, "green"},
		{"nope", "", qrpc.CodeUnknownMethod, `qrpc: unknown method "nope"`},
	}
	for _, tc := range cases {
		r := unary(t, c, tc.method, tc.body)
		if r.Code != tc.code || string(r.Body) != tc.want {
			t.Errorf("%s(%q) = %d %q, want %d %q", tc.method, tc.body, r.Code, r.Body, tc.code, tc.want)
		}
	}

	r := unary(t, c, "echo", "b", []byte("k1"), []byte("v1"), []byte("k2"), []byte(""))
	want := [][]byte{[]byte("k1"), []byte("v1"), []byte("k2"), []byte("")}
	if len(r.Headers) != len(want) {
		t.Fatalf("echo headers = %q, want %q", r.Headers, want)
	}
	for i := range want {
		if !bytes.Equal(r.Headers[i], want[i]) {
			t.Fatalf("echo headers = %q, want %q", r.Headers, want)
		}
	}

	for i := 0; i < 3; i++ {
		if err := c.Event([]byte("notify"), nil, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	// Events are one-way: poll the counter, bounded in time.
	testwait.For(5*time.Second, func() bool { return in.demo.notify.Load() >= 3 })
	if got := string(unary(t, c, "stats", "").Body); !strings.HasPrefix(got, `{"notify":3,`) {
		t.Fatalf("stats = %s, want notify 3", got)
	}
}

func TestMTLSListener(t *testing.T) {
	dir := t.TempDir()
	in := startDemo(t, dir)
	ca := readFile(t, dir, fileCA)

	// In TLS 1.3 the client finishes its handshake before the server has
	// checked the client certificate, so the refusal may surface at Dial or
	// at the first call; it must surface.
	if nc, err := dial(t, in.mtlsAddr, &qrpc.Config{CAPEM: ca}); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if r, err := nc.Unary(ctx, "greet", []byte("x")); err == nil {
			t.Fatalf("call without a client certificate answered: %d %q", r.Code, r.Body)
		}
	} else if !errors.Is(err, qrpc.ErrDial) {
		t.Fatalf("dial without a client certificate: err = %v, want a connect error", err)
	}
	c, err := dial(t, in.mtlsAddr, &qrpc.Config{
		CAPEM:   ca,
		CertPEM: readFile(t, dir, fileClientCert),
		KeyPEM:  readFile(t, dir, fileClientKey),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(unary(t, c, "greet", "mtls").Body); got != "Hello mtls!" {
		t.Fatalf("greet over mTLS = %q", got)
	}
}

func TestCertificatesReused(t *testing.T) {
	dir := t.TempDir()
	first := startDemo(t, dir)
	ca := readFile(t, dir, fileCA)
	first.close()

	second := startDemo(t, dir)
	if !strings.Contains(second.certs, "reused") {
		t.Fatalf("second start: certs %q, want reused", second.certs)
	}
	if !bytes.Equal(ca, readFile(t, dir, fileCA)) {
		t.Fatal("CA rewritten on restart")
	}
	// The old CA must still verify the restarted server.
	c, err := dial(t, second.addr, &qrpc.Config{CAPEM: ca, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	unary(t, c, "greet", "again")

	// A damaged directory is regenerated instead of failing.
	if err := os.WriteFile(filepath.Join(dir, fileServerKey), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	second.close()
	third := startDemo(t, dir)
	if !strings.Contains(third.certs, "generated") {
		t.Fatalf("third start: certs %q, want generated", third.certs)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-cert", "a.pem"},
		{"-cert", "a.pem", "-key", "a.key"}, // mTLS listener without -client-ca
		{"stray"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	if _, err := parseFlags([]string{"-cert", "a.pem", "-key", "a.key", "-mtls-addr", ""}); err != nil {
		t.Errorf("mTLS disabled: %v", err)
	}
}
