package qrpc_test

import (
	"net"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestPoolDNS: a name served by the test's own DNS server goes from 2
// addresses to 3, then to 1; the pool's servers follow within its resolve
// interval and no call fails on the way.
func TestPoolDNS(t *testing.T) {
	checkGoroutines(t)
	f := newFleet(t)
	first := f.add("127.0.0.1:0")
	_, port, _ := net.SplitHostPort(first.addr)
	f.add("127.0.0.2:" + port)
	f.add("127.0.0.3:" + port)
	const name = "pool.qrpc.test."
	dns := dnstest.Start(t, name)
	dns.Set("127.0.0.1", "127.0.0.2")
	p := f.dial(t, []string{"pool.qrpc.test:" + port}, &qrpc.PoolConfig{
		// The certificate is for localhost: the name checked is set, not
		// taken from the DNS name.
		Config:   qrpc.Config{ServerName: "localhost"},
		Resolve:  100 * time.Millisecond,
		Resolver: dns.Addr,
	})
	var failed, done atomic.Int64
	var lastErr atomic.Pointer[error]
	stop := make(chan struct{})
	wg := load(8, stop, func() error {
		_, err := poolCall(p, 5*time.Second, "who", "")
		return err
	}, func(err error, _ time.Time) {
		done.Add(1)
		if err != nil {
			failed.Add(1)
			lastErr.Store(&err)
		}
	})
	follows := func(want ...string) {
		t.Helper()
		for i := range want {
			want[i] += ":" + port
		}
		testwait.Until(t, "peers follow DNS to "+strings.Join(want, ","), 10*time.Second, func() bool {
			var got []string
			for _, in := range p.Peers() {
				if in.State != qrpc.PeerUp {
					return false
				}
				got = append(got, in.Addr)
			}
			sort.Strings(got)
			return strings.Join(got, ",") == strings.Join(want, ",")
		})
	}
	follows("127.0.0.1", "127.0.0.2")
	progress(t, "calls over two servers", done.Load, 100, 30*time.Second, nil)
	dns.Set("127.0.0.1", "127.0.0.2", "127.0.0.3")
	follows("127.0.0.1", "127.0.0.2", "127.0.0.3")
	h := f.srvs[2].hits.Load()
	testwait.Until(t, "the new server takes calls", 10*time.Second, func() bool { return f.srvs[2].hits.Load() > h+20 })
	dns.Set("127.0.0.2")
	follows("127.0.0.2")
	// Over the next 200 calls, the removed servers take none.
	h0, h2 := f.srvs[0].hits.Load(), f.srvs[2].hits.Load()
	progress(t, "calls after the removal", done.Load, 200, 30*time.Second, nil)
	close(stop)
	wg.Wait()
	if f.srvs[0].hits.Load() != h0 || f.srvs[2].hits.Load() != h2 {
		t.Fatal("removed servers still take calls")
	}
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d calls failed, last: %v", n, *lastErr.Load())
	}
	if p.Conns() != 1 {
		t.Fatalf("%d connections after draining, want 1", p.Conns())
	}
	t.Logf("%d DNS queries", dns.Queries())
}
