package nginx

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

const shapesProto3 = `syntax = "proto3";
package rv;
import "google/protobuf/struct.proto";
import "google/protobuf/type.proto";
import "google/protobuf/descriptor.proto";
import "r2p2.proto";
import "r2ed.proto";
message NV { google.protobuf.NullValue nv = 1; string s = 2; google.protobuf.Value v = 3; }
enum Al { option allow_alias = true; AL_ZERO = 0; AL_NIL = 0; AL_ONE = 1; }
message AlM { Al a = 1; }
message Resp {
  NV nv = 1;
  r2p2.G g = 2;
  r2ed.D ed = 3;
  google.protobuf.Type ty = 4;
  google.protobuf.FileDescriptorProto fdp = 5;
  AlM al = 6;
  r2ed.I edi = 7;
}
service S { rpc Echo(Resp) returns (Resp); }
`

const shapesProto2 = `syntax = "proto2";
package r2p2;
message G {
  optional group MyGroup = 1 { optional int32 x = 1; }
  repeated group Items = 2 { optional int32 y = 1; }
  optional string s = 3;
}
`

const shapesEditions = `edition = "2023";
package r2ed;
option features.field_presence = IMPLICIT;
enum Closed { option features.enum_type = CLOSED; C_ONE = 1; }
message D {
  message Inner { int32 k = 1; }
  Inner inner = 1 [features.message_encoding = DELIMITED];
  string s = 2;
  int32 x = 3 [features.field_presence = EXPLICIT];
  Closed c = 4 [features.field_presence = EXPLICIT];
}
message I { int64 n = 1; string s = 2; bytes b = 3; }
`

// TestGatewayCompatResponseBodyMoreShapes: for each response_body field
// of rv.Resp left unset, the gateway under compat = "grpc-gateway" must
// answer the bytes protojson writes for the field's nil message, with
// the gateway's marshal options (EmitUnpopulated as compat defaults,
// UseProtoNames when proto_names is set). protojson's whitespace is
// compacted before comparing (it randomises it), the key order is kept.
func TestGatewayCompatResponseBodyMoreShapes(t *testing.T) {
	dir := gatewayDir(t)
	files := map[string]string{"rv.proto": shapesProto3, "r2p2.proto": shapesProto2, "r2ed.proto": shapesEditions}
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

	fields := []string{"nv", "g", "ed", "ty", "fdp", "al", "edi"}
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        local protos = { files = { "rv.proto" }, import_paths = { qt.proto_dir } }`,
			`        local routes = {}`,
			`        for _, f in ipairs({ "nv", "g", "ed", "ty", "fdp", "al", "edi" }) do`,
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
	for _, b := range []string{`{"g":{"MyGroup":{"x":1},"s":"a"}}`, `{"g":{"mygroup":{"x":1},"s":"a"}}`, `{"nv":{"s":"a"}}`} {
		for _, pfx := range []string{"/c", "/n"} {
			r := n.rawReq(t, "POST", pfx+"/v1/rb/"+map[bool]string{true: "nv", false: "g"}[b[2] == 'n'], b, "Content-Type", "application/json")
			t.Logf("set: %s %s -> %d %s", pfx, b, r.status, r.body)
		}
	}
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
