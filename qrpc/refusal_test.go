package qrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestRefusalGivesWayToNewerFailure: a connection the server refused
// (mTLS: no client certificate) leaves its reason for the calls that find
// the client down, until a newer failure is why it is down: once the
// server is gone (its port closed) calls say "refused", not the old TLS
// verdict. The refusal used to last until a dial succeeded.
func TestRefusalGivesWayToNewerFailure(t *testing.T) {
	ca := newCA(t, "mtls ca")
	clientCA := newCA(t, "client ca")
	pair := issue(t, ca, certs.Options{Hosts: []string{"127.0.0.1"}})
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	srv := qrpc.NewServer(&qrpc.ServerConfig{Logger: quiet})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(cert, clientCA.Pool()))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Up before the server's verdict (as when the wait for it runs out
	// under load): the refusal ends a live connection.
	// On a loaded machine the verdict may come before Dial returns: that
	// dial proves nothing here, so it is tried again (a few times).
	var c *qrpc.Client
	for try := 0; try < 20; try++ {
		c, err = qrpc.Dial(ctx, a.String(), qrpc.SkipConfirmationForTest(&qrpc.Config{CAPEM: ca.CertPEM, Logger: quiet,
			BackoffBase: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond, DialTimeout: time.Second, CloseLinger: -1}))
		if err == nil || qrpc.Classify(err).Reason != qrpc.ReasonClientCertNeeded {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reason := func() string {
		_, err := c.Start(&qrpc.Call{Method: []byte("echo")}, func(*qrpc.Response, error) {})
		return qrpc.Classify(err).Reason
	}
	testwait.Until(t, "calls refused for the client certificate", 20*time.Second, func() bool {
		return reason() == qrpc.ReasonClientCertNeeded
	})
	_ = srv.Close()
	var last string
	if !testwait.For(20*time.Second, func() bool {
		last = reason()
		return last == qrpc.ReasonRefused
	}) {
		t.Fatalf("with the server gone the calls still say %q, want %q", last, qrpc.ReasonRefused)
	}
}
