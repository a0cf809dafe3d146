package qrpc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
)

// TestNewResolverTruncated: a name with 100 addresses, whose UDP answer the
// server truncates (TC) as name servers do: the resolver of a pool's
// resolver option asks again over TCP and gets all 100.
func TestNewResolverTruncated(t *testing.T) {
	dns := dnstest.Start(t, "big.qrpc.test.")
	var ips []string
	for i := range 100 {
		ips = append(ips, fmt.Sprintf("127.0.9.%d", 1+i))
	}
	dns.Set(ips...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := newResolver(dns.Addr).LookupNetIP(ctx, "ip4", "big.qrpc.test")
	if err != nil || len(got) != len(ips) {
		t.Fatalf("resolver %s: %d addresses, err %v; want %d", dns.Addr, len(got), err, len(ips))
	}
}
