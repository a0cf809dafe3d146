package nginx

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

// TestResolverTruncatedOverTCP: a name whose 100 A records do not fit in
// a UDP answer: the DNS server sets TC, as name servers do, and answers
// in full over TCP. connect with resolver = that server resolves all 100
// (Go's resolver asks again over TCP), as a plain stub resolver does.
func TestResolverTruncatedOverTCP(t *testing.T) {
	bin, dir := buildDemo(t)
	port := ngxtest.FreePort(t)
	startDemo(t, bin, dir, fmt.Sprintf("0.0.0.0:%d", port))
	var ips []string
	for i := range 100 {
		ips = append(ips, fmt.Sprintf("127.0.9.%d", 1+i))
	}
	dns := dnstest.Start(t, "big.pool.test.")
	dns.Set(ips...)
	// The test server's own check: a stub resolver finds the 100.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, dns.Addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := r.LookupNetIP(ctx, "ip4", "big.pool.test"); len(got) != 100 {
		t.Fatalf("stub resolver: %d addresses, err %v", len(got), err)
	}
	n := luaRunNginx(t, map[string]string{"name": fmt.Sprintf("big.pool.test:%d", port), "dns": dns.Addr})
	body := strings.TrimSpace(runLua(t, n, `
local c, err = qrpc.connect(qt.name, qt.opts({ resolver = qt.dns, timeout = 2000 }))
if not c then ngx.say("connect: ", err) return end
local r, e = c:unary("greet", "x")
ngx.say("peers ", #c:peers(), " call ", r and "ok" or e)
`))
	if body != "peers 100 call ok" {
		t.Errorf("resolver = %q (100 addresses, over TCP after TC): %q, want \"peers 100 call ok\"", dns.Addr, body)
	}
}
