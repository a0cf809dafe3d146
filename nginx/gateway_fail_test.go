package nginx

import (
	"context"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestGatewayAttemptsOnFailure: a call that fails after its retry (both
// servers hold GetItem past try_timeout) answers 504, and $qrpc_attempts
// is the count the failed call gives in its info table: 2.
func TestGatewayAttemptsOnFailure(t *testing.T) {
	dir := gatewayDir(t)
	var addrs []string
	for range 2 {
		held := qrpc.NewServer(&qrpc.ServerConfig{})
		held.Handle("GetItem", func(ctx context.Context, _ *qrpc.Request, _ *qrpc.Response) { <-ctx.Done() })
		a, err := held.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = held.Close() })
		addrs = append(addrs, a.String())
	}
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        package.loaded.gw = assert(gateway.new{`,
			`            upstream = { qt.h1, qt.h2 }, prefix = "/a",`,
			`            protos = { files = { "shop.proto" }, import_paths = { qt.proto_dir } },`,
			`            opts = qt.opts({ timeout = 3000, try_timeout = 200, retries = 1,`,
			`                             health = { stall = 0, failures = 1000 } }),`,
			`        })`,
		),
		Extra: map[string]string{"h1": addrs[0], "h2": addrs[1], "proto_dir": dir},
		Server: `
        location /a/ {
            set $qrpc_attempts "";
            content_by_lua_block { package.loaded.gw:serve() }
            header_filter_by_lua_block { ngx.header["X-Attempts"] = ngx.var.qrpc_attempts }
        }`,
	})
	r := n.req(t, "GET", "/a/v1/items/1", "")
	if r.status != 504 || r.hdr.Get("X-Attempts") != "2" {
		t.Fatalf("%d, X-Attempts %q: want 504 after 2 attempts (%s)", r.status, r.hdr.Get("X-Attempts"), r.body)
	}
}
