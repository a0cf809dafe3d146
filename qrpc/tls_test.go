package qrpc_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// tlsServer starts a qrpc server with the given certificate (and, with
// clientCAs, mandatory client certificates) and returns its address.
func tlsServer(t *testing.T, pair certs.Pair, clientCAs *x509.CertPool) string {
	t.Helper()
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	srv := qrpc.NewServer(&qrpc.ServerConfig{Logger: quiet})
	srv.Handle("echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) { resp.Body = req.Body })
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(cert, clientCAs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return a.String()
}

func issue(t *testing.T, ca *certs.CA, o certs.Options) certs.Pair {
	t.Helper()
	p, err := ca.Issue(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newCA(t *testing.T, name string) *certs.CA {
	t.Helper()
	ca, err := certs.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// dialOnce connects and makes one call, returning the first error.
func dialOnce(addr string, cfg *qrpc.Config) error {
	cfg.Logger = quiet
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Unary(ctx, "echo", []byte("hi"))
	return err
}

func dialReason(t *testing.T, err error) string {
	t.Helper()
	var de *qrpc.DialError
	if !errors.As(err, &de) || !errors.Is(err, qrpc.ErrDial) {
		t.Fatalf("want a *qrpc.DialError, got %T: %v", err, err)
	}
	return de.Reason
}

func spki(t *testing.T, pair certs.Pair) []byte {
	t.Helper()
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	return sum[:]
}

// TestBadTLS: each way a handshake can go wrong gives its own short reason.
func TestBadTLS(t *testing.T) {
	checkGoroutines(t)
	ca := newCA(t, "good ca")
	other := newCA(t, "other ca")
	good := tlsServer(t, issue(t, ca, certs.Options{Hosts: []string{"localhost", "127.0.0.1"}}), nil)
	wrongHost := tlsServer(t, issue(t, ca, certs.Options{Hosts: []string{"other.example"}}), nil)
	expired := tlsServer(t, issue(t, ca, certs.Options{
		Hosts: []string{"127.0.0.1"}, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
	}), nil)
	notYet := tlsServer(t, issue(t, ca, certs.Options{
		Hosts: []string{"127.0.0.1"}, NotBefore: time.Now().Add(24 * time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
	}), nil)
	alpn := otherALPNServer(t, issue(t, ca, certs.Options{Hosts: []string{"127.0.0.1"}}))

	cases := []struct {
		name   string
		addr   string
		cfg    qrpc.Config
		reason string
	}{
		{"unknown CA", good, qrpc.Config{CAPEM: other.CertPEM}, "certificate signed by unknown authority"},
		{"system roots do not know a private CA", good, qrpc.Config{}, "certificate signed by unknown authority"},
		{"wrong host name", wrongHost, qrpc.Config{CAPEM: ca.CertPEM}, "certificate is for another host"},
		{"server name given but not in the certificate", good, qrpc.Config{CAPEM: ca.CertPEM, ServerName: "qrpc.example.com"}, "certificate is for another host"},
		{"expired certificate", expired, qrpc.Config{CAPEM: ca.CertPEM}, "certificate expired or not yet valid"},
		{"not yet valid certificate", notYet, qrpc.Config{CAPEM: ca.CertPEM}, "certificate expired or not yet valid"},
		{"ALPN mismatch", alpn, qrpc.Config{CAPEM: ca.CertPEM}, "no application protocol (ALPN qrpc refused)"},
	}
	seen := map[string]string{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := dialOnce(tc.addr, &tc.cfg)
			if got := dialReason(t, err); got != tc.reason {
				t.Fatalf("reason %q, want %q (err: %v)", got, tc.reason, err)
			}
			if !strings.Contains(err.Error(), tc.addr) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("message should name the address and the reason: %q", err)
			}
			seen[tc.reason] = tc.name
		})
	}
	if len(seen) != 4 {
		t.Fatalf("want 4 distinct reasons, got %v", seen)
	}

	// The happy paths around them.
	if err := dialOnce(good, &qrpc.Config{CAPEM: ca.CertPEM}); err != nil {
		t.Fatalf("good server: %v", err)
	}
	if err := dialOnce(wrongHost, &qrpc.Config{CAPEM: ca.CertPEM, ServerName: "other.example"}); err != nil {
		t.Fatalf("ServerName override: %v", err)
	}
	if err := dialOnce(good, &qrpc.Config{CAPEM: ca.CertPEM, ServerName: "localhost"}); err != nil {
		t.Fatalf("ServerName localhost: %v", err)
	}
	// Verification is off only when asked.
	if err := dialOnce(good, &qrpc.Config{CAPEM: other.CertPEM, InsecureSkipVerify: true}); err != nil {
		t.Fatalf("InsecureSkipVerify: %v", err)
	}
}

// otherALPNServer is a QUIC server that speaks only "h3".
func otherALPNServer(t *testing.T, pair certs.Pair) string {
	t.Helper()
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h3"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			_ = c.CloseWithError(0, "")
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

func TestPins(t *testing.T) {
	checkGoroutines(t)
	ca := newCA(t, "pin ca")
	other := newCA(t, "other ca")
	pair := issue(t, ca, certs.Options{Hosts: []string{"127.0.0.1"}})
	addr := tlsServer(t, pair, nil)
	pin := spki(t, pair)
	wrong := sha256.Sum256([]byte("some other key"))

	if err := dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM, Pins: [][]byte{wrong[:], pin}}); err != nil {
		t.Fatalf("matching pin (second of two): %v", err)
	}
	err := dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM, Pins: [][]byte{wrong[:]}})
	if got := dialReason(t, err); got != "certificate pin mismatch" {
		t.Fatalf("mismatching pin: reason %q (%v)", got, err)
	}
	// A matching pin does not stand in for the chain: an unknown CA still fails.
	err = dialOnce(addr, &qrpc.Config{CAPEM: other.CertPEM, Pins: [][]byte{pin}})
	if got := dialReason(t, err); got != "certificate signed by unknown authority" {
		t.Fatalf("pin with unverifiable chain: reason %q (%v)", got, err)
	}
	// Nor for the name.
	err = dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM, ServerName: "elsewhere.example", Pins: [][]byte{pin}})
	if got := dialReason(t, err); got != "certificate is for another host" {
		t.Fatalf("pin with wrong name: reason %q (%v)", got, err)
	}
	// A malformed pin is a config error, caught before dialling.
	if err := dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM, Pins: [][]byte{pin[:31]}}); !errors.Is(err, qrpc.ErrBadConfig) {
		t.Fatalf("short pin: %v", err)
	}
}

func TestMutualTLS(t *testing.T) {
	checkGoroutines(t)
	ca := newCA(t, "mtls ca")
	clientCA := newCA(t, "client ca")
	other := newCA(t, "stranger ca")
	addr := tlsServer(t, issue(t, ca, certs.Options{Hosts: []string{"127.0.0.1"}}), clientCA.Pool())
	good := issue(t, clientCA, certs.Options{Hosts: []string{"client"}, Client: true})
	stranger := issue(t, other, certs.Options{Hosts: []string{"client"}, Client: true})

	if err := dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM, CertPEM: good.CertPEM, KeyPEM: good.KeyPEM}); err != nil {
		t.Fatalf("mTLS satisfied: %v", err)
	}
	err := dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM})
	if got := dialReason(t, err); got != "client certificate required by server" {
		t.Fatalf("no client certificate: reason %q (%v)", got, err)
	}
	// Go's client withholds a certificate whose CA the server does not list.
	err = dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM, CertPEM: stranger.CertPEM, KeyPEM: stranger.KeyPEM})
	if got := dialReason(t, err); got != "client certificate required by server" {
		t.Fatalf("client certificate from an unknown CA: reason %q (%v)", got, err)
	}
	// One from the right CA that fails verification is sent, and rejected.
	expired := issue(t, clientCA, certs.Options{Hosts: []string{"client"}, Client: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	err = dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM, CertPEM: expired.CertPEM, KeyPEM: expired.KeyPEM})
	if got := dialReason(t, err); got != "client certificate rejected by server" {
		t.Fatalf("expired client certificate: reason %q (%v)", got, err)
	}
	if err := dialOnce(addr, &qrpc.Config{CAPEM: ca.CertPEM, CertPEM: good.CertPEM}); !errors.Is(err, qrpc.ErrBadConfig) {
		t.Fatalf("cert without key: %v", err)
	}
}

// TestLateClientCertRejection: with TLS 1.3 the server judges the client
// certificate after the client has finished its handshake, so its verdict
// can reach a call rather than Dial. The call must still fail as a refused
// dial (connect: ...), never as a lost connection: with the server's alert
// when it arrives first (the reason names the certificate), or with the
// stateless reset the server answers the call's packet with once it has
// dropped the connection (a loaded machine: the alert is overtaken), which
// is a handshake failure.
func TestLateClientCertRejection(t *testing.T) {
	checkGoroutines(t)
	ca := newCA(t, "late ca")
	clientCA := newCA(t, "late client ca")
	addr := tlsServer(t, issue(t, ca, certs.Options{Hosts: []string{"127.0.0.1"}}), clientCA.Pool())
	for i := 0; i < 5; i++ {
		err := dialOnce(addr, qrpc.SkipConfirmationForTest(&qrpc.Config{CAPEM: ca.CertPEM}))
		got := dialReason(t, err)
		if got != "client certificate required by server" && got != "tls handshake failed" {
			t.Fatalf("try %d: reason %q (%v)", i, got, err)
		}
	}
}

// TestDialUnresolvable: a host name that does not resolve says so.
func TestDialUnresolvable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, addr := range []string{"nohost.invalid:443", "256.1.1.1:5"} {
		_, err := qrpc.Dial(ctx, addr, &qrpc.Config{DialTimeout: time.Second, Logger: quiet})
		var de *qrpc.DialError
		if !errors.As(err, &de) || de.Reason != "cannot resolve host" {
			t.Errorf("%s: %v, want reason %q", addr, err, "cannot resolve host")
		}
	}
}
