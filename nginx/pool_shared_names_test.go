package nginx

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
)

// TestPoolSharedNameKeepsOwnAddresses: two pools of different DNS names,
// shared under one name (shared = { dict, name }), both re-resolving in
// two workers: each keeps its own resolver lease and resolved list (they
// share verdicts by server only), so a call through each goes to a server
// its own name resolves to, never to the other pool's.
func TestPoolSharedNameKeepsOwnAddresses(t *testing.T) {
	requireNginx(t)
	a, b := ownServer(t), ownServer(t)
	_, pa, _ := net.SplitHostPort(a.addr)
	_, pb, _ := net.SplitHostPort(b.addr)
	dns := dnstest.Start(t, "a.qrpc.test.")
	dns.SetA("a.qrpc.test.", "127.0.0.1")
	dns.SetA("b.qrpc.test.", "127.0.0.1")
	extra := map[string]string{"na": "a.qrpc.test:" + pa, "nb": "b.qrpc.test:" + pb, "dns": dns.Addr}
	mk := func(which string) string {
		return `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function pool()
                    return qrpc.connect(qt.` + which + `, qt.opts({ resolve = 200, resolver = qt.dns, timeout = 1000,
                        shared = { dict = "qrpc_pools", name = "orders" } }))
                end` + poolCallLua(`"who", ""`)
	}
	n := startNginx(t, ngxConf{Workers: 2, Extra: extra, HTTP: "    lua_shared_dict qrpc_pools 1m;\n",
		Server: loc("/a", mk("na")) + loc("/b", mk("nb")), AllowErrors: []string{`qrpc: `}})
	wrong := map[string]int{}
	for i := range 60 {
		for _, c := range []struct{ path, want string }{{"/a", a.addr}, {"/b", b.addr}} {
			st, body := n.get(c.path)
			body = strings.TrimSpace(body)
			if st != 200 || body != c.want {
				wrong[fmt.Sprintf("%s -> %d %s", c.path, st, body)]++
			}
		}
		if i%10 == 0 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	if len(wrong) > 0 {
		t.Errorf("calls went to a server their pool's name does not resolve to: %v (a=%s b=%s)", wrong, a.addr, b.addr)
	}
}
