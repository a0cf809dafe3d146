package nginx

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

const rvProto3 = `syntax = "proto3";
package rv;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/source_context.proto";
import "rvp2.proto";
import "rved.proto";
enum Color { COLOR_UNSPECIFIED = 0; RED = 1; }
message Z {
  string b_field = 2;
  int64 a_int = 1;
  uint64 u = 3;
  bytes raw = 4;
  double d = 5;
  float f = 6;
  bool ok = 7;
  Color color = 8;
  map<string, int32> m = 9;
  repeated Z list = 10;
  Z child = 11;
  oneof choice { string s = 12; Z zc = 13; }
  optional int32 opt = 14;
  google.protobuf.Timestamp ts = 15;
  google.protobuf.Int64Value w = 16;
  string custom = 17 [json_name = "X-Custom"];
  sint64 s64 = 18;
  fixed64 f64 = 19;
  google.protobuf.Value v = 20;
  string foo_1bar = 21;
}
message Resp {
  Z z = 1;
  rvp2.P p = 2;
  rved.E e = 3;
  google.protobuf.SourceContext sc = 4;
  google.protobuf.Int64Value w = 5;
  google.protobuf.BytesValue bw = 6;
  oneof o { Z oz = 7; }
  optional Z optz = 8;
  rvp2.Q q = 9;
}
service S { rpc Echo(Resp) returns (Resp); }
`

const rvProto2 = `syntax = "proto2";
package rvp2;
enum Level { LOW = 5; HIGH = 6; }
message P {
  optional string name = 1;
  optional Level level = 2;
  optional int32 n = 3 [default = 7];
  repeated int32 r = 4;
}
// no optional keyword: a proto2 field with label "required" is refused by
// protojson when unset; Q has only repeated and maps
message Q {
  repeated string tags = 1;
  map<string, string> kv = 2;
}
`

const rvEditions = `edition = "2023";
package rved;
message E {
  string name = 1;
  int32 n = 2 [features.field_presence = IMPLICIT];
}
`

// TestGatewayCompatResponseBodyVsProtojson: for each response_body field
// of rv.Resp left unset, the gateway under compat = "grpc-gateway" must
// answer the bytes protojson writes for the field's nil message, with
// the gateway's marshal options (EmitUnpopulated as compat defaults,
// UseProtoNames when proto_names is set). protojson's whitespace is
// compacted before comparing (it randomises it), the key order is kept.
func TestGatewayCompatResponseBodyVsProtojson(t *testing.T) {
	compareUnsetResponseBody(t, map[string]string{"rv.proto": rvProto3, "rvp2.proto": rvProto2, "rved.proto": rvEditions},
		[]string{"z", "p", "e", "sc", "w", "bw", "oz", "optz", "q"})
}

// compareUnsetResponseBody serves rv.proto (files, written into the
// gateway's directory) through three compat gateways, one route per field
// of rv.Resp as response_body, and compares each answer to {} with
// protojson's bytes for the field's nil message.
func compareUnsetResponseBody(t *testing.T, files map[string]string, fields []string) {
	t.Helper()
	dir := gatewayDir(t)
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	comp := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{dir}})}
	fds, err := comp.Compile(context.Background(), "rv.proto")
	if err != nil {
		t.Fatal(err)
	}
	resp := fds[0].Messages().ByName("Resp")

	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	srv.Handle("Echo", func(_ context.Context, req *qrpc.Request, r *qrpc.Response) { r.Body = req.Body })
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })

	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        local protos = { files = { "rv.proto" }, import_paths = { qt.proto_dir } }`,
			`        local routes = {}`,
			`        for _, f in ipairs({ "`+strings.Join(fields, `", "`)+`" }) do`,
			`            routes["POST /v1/rb/" .. f] = { method = "rv.S.Echo", body = "*", response_body = f }`,
			`        end`,
			`        local function gw(prefix, o)`,
			`            o.upstream, o.prefix, o.protos, o.routes = qt.rv_addr, prefix, protos, routes`,
			`            o.opts = qt.opts({ timeout = 10000 })`,
			`            package.loaded["gw" .. prefix] = assert(gateway.new(o))`,
			`        end`,
			`        gw("/c", { compat = "grpc-gateway" })`,
			`        gw("/n", { compat = "grpc-gateway", proto_names = true })`,
			`        gw("/e", { compat = "grpc-gateway", emit_unpopulated = false })`,
		),
		Extra: map[string]string{"rv_addr": a.String(), "proto_dir": dir},
		Server: `
        location /c/ { content_by_lua_block { package.loaded["gw/c"]:serve() } }
        location /n/ { content_by_lua_block { package.loaded["gw/n"]:serve() } }
        location /e/ { content_by_lua_block { package.loaded["gw/e"]:serve() } }`,
	})
	for _, g := range []struct {
		prefix string
		opts   protojson.MarshalOptions
	}{
		{"/c", protojson.MarshalOptions{EmitUnpopulated: true}},
		{"/n", protojson.MarshalOptions{EmitUnpopulated: true, UseProtoNames: true}},
		{"/e", protojson.MarshalOptions{}},
	} {
		for _, f := range fields {
			fd := resp.Fields().ByName(protoreflect.Name(f))
			// grpc-gateway: marshaler.Marshal(response.F), a typed nil message
			nilMsg := dynamicpb.NewMessageType(fd.Message()).Zero().Interface()
			want, merr := g.opts.Marshal(nilMsg)
			var cw bytes.Buffer
			if merr == nil {
				_ = json.Compact(&cw, want)
			}
			r := n.rawReq(t, "POST", g.prefix+"/v1/rb/"+f, `{}`, "Content-Type", "application/json")
			switch {
			case merr != nil:
				t.Logf("%s %s: protojson refuses (%v); gateway %d %s", g.prefix, f, merr, r.status, r.body)
			case r.status != 200 || r.body != cw.String():
				t.Errorf("%s response_body %s (%s): gateway %d %s\n   protojson (grpc-gateway) %s", g.prefix, f, fd.Message().FullName(), r.status, r.body, cw.String())
			default:
				t.Logf("%s %s: same: %s", g.prefix, f, r.body)
			}
		}
	}
}
