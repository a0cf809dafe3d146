//go:build qrpctesthooks

package qrpc_test

import (
	"net"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestPoolDrainPanicCloses: the goroutine that drains a server DNS took
// out panics: the panic is counted, the server is closed all the same
// (not left open and listed as draining until the pool closes), and the
// pool's calls go on.
func TestPoolDrainPanicCloses(t *testing.T) {
	reports := reportsTo(t)
	f := newFleet(t)
	first := f.add("127.0.0.1:0")
	_, port, _ := net.SplitHostPort(first.addr)
	f.add("127.0.0.2:" + port)
	const name = "drain.qrpc.test."
	dns := dnstest.Start(t, name)
	dns.Set("127.0.0.1", "127.0.0.2")
	p := f.dial(t, []string{"drain.qrpc.test:" + port}, &qrpc.PoolConfig{
		Config:   qrpc.Config{ServerName: "localhost"},
		Resolve:  50 * time.Millisecond,
		Resolver: dns.Addr,
	})
	testwait.Until(t, "two connections", 10*time.Second, func() bool { return p.Conns() == 2 })
	safego.Arm("pool drain", 1)
	defer safego.Arm("pool drain", 0)
	dns.Set("127.0.0.2")
	testwait.Until(t, "the drain to panic", 10*time.Second, func() bool { return reports("pool drain") == 1 })
	testwait.Until(t, "the drained server closed", 10*time.Second, func() bool { return p.Conns() == 1 })
	for i := range 20 {
		if _, err := poolCall(p, 5*time.Second, "who", ""); err != nil {
			t.Fatalf("call %d after the panic: %v", i, err)
		}
	}
	if n := len(p.Peers()); n != 1 {
		t.Fatalf("%d servers listed, want 1", n)
	}
}
