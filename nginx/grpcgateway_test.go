package nginx

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// echoServiceServer plays grpc-gateway's example EchoService
// (examples/internal/server/echo.go) over qrpc: the methods answer their
// request, EchoBody with the header metadata foo: foo1 and bar: bar1,
// EchoUnauthorized with code 16 (Unauthenticated), EchoStatus with
// result "ok" and the request's two statuses.
func echoServiceServer(t *testing.T) string {
	t.Helper()
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	echo := func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) { resp.Body = req.Body }
	for _, m := range []string{"Echo", "EchoDelete", "EchoPatch"} {
		srv.Handle(m, echo)
	}
	srv.Handle("EchoBody", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		resp.Body = req.Body
		resp.Headers = [][]byte{[]byte("foo"), []byte("foo1"), []byte("bar"), []byte("bar1")}
	})
	srv.Handle("EchoUnauthorized", func(_ context.Context, _ *qrpc.Request, resp *qrpc.Response) {
		resp.Code, resp.Body = 16, []byte("unauthorized err")
	})
	srv.Handle("EchoStatus", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		// StatusCheckResponse{result = 1, sub_status = 2, sub2_status = 3}:
		// the request's fields 2 and 3 have the same numbers
		out := protowire.AppendTag(nil, 1, protowire.BytesType)
		out = protowire.AppendString(out, "ok")
		b := req.Body
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				resp.Code = 3
				return
			}
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				resp.Code = 3
				return
			}
			if num != 1 {
				out = append(out, b[:n+m]...)
			}
			b = b[n+m:]
		}
		resp.Body = out
	})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return a.String()
}

// grpcGatewayProtos copies nginx/testdata/grpc-gateway where nginx's
// workers can read it.
func grpcGatewayProtos(t *testing.T) string {
	t.Helper()
	dir := gatewayDir(t)
	copyProtoTree(t, filepath.Join(repoRoot, "nginx", "testdata", "grpc-gateway"), dir)
	return dir
}

// TestGrpcGatewayEcho runs grpc-gateway's integration cases for its echo
// service (examples/internal/integration/integration_test.go, the v1
// prefix) against gateway.new{ compat = "grpc-gateway", codes = "grpc" }
// serving echo_service.proto in front of echoServiceServer. Each subtest
// is named after the case it follows; what each checks is what the
// upstream case checks. Left out: the v2 prefix (another mux of their
// test setup), the Grpc-Trailer-* half of testEchoBody (qrpc has no
// trailers) and TestNotImplemented (501 there; 405 with Allow here, as
// HTTP asks: checked below).
func TestGrpcGatewayEcho(t *testing.T) {
	dir := grpcGatewayProtos(t)
	addr := echoServiceServer(t)
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        package.loaded.gw = assert(gateway.new{ upstream = qt.echo_addr,`,
			`            protos = { files = { "examples/internal/proto/examplepb/echo_service.proto" },`,
			`                       import_paths = { qt.proto_dir } },`,
			`            compat = "grpc-gateway", codes = "grpc", opts = qt.opts({ timeout = 10000 }) })`,
		),
		Extra:  map[string]string{"echo_addr": addr, "proto_dir": dir},
		Server: `        location / { content_by_lua_block { package.loaded.gw:serve() } }`,
	})

	// msg decodes an answer as the upstream cases do (protojson accepts
	// both name forms; missing fields are zero).
	msg := func(t *testing.T, r gwResp) map[string]any {
		t.Helper()
		if r.status != 200 {
			t.Fatalf("status %d, want 200: %s", r.status, r.body)
		}
		if ct := r.hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q, want application/json", ct)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(r.body), &m); err != nil {
			t.Fatalf("%v: %s", err, r.body)
		}
		return m
	}
	get := func(m map[string]any, path ...string) any {
		var v any = m
		for _, k := range path {
			mm, _ := v.(map[string]any)
			v = mm[k]
		}
		return v
	}
	ct := "application/json"

	t.Run("testEcho", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "POST", "/v1/example/echo/myid", "{}", "Content-Type", ct))
		if get(m, "id") != "myid" {
			t.Errorf("id %v, want myid", m)
		}
	})
	t.Run("testEchoOneof", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "GET", "/v1/example/echo/myid/10/golang", ""))
		if get(m, "lang") != "golang" {
			t.Errorf("lang %v, want golang", m)
		}
	})
	t.Run("testEchoOneof1", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "GET", "/v1/example/echo1/myid/10/golang", ""))
		if get(m, "status", "note") != "golang" {
			t.Errorf("status.note %v, want golang", m)
		}
	})
	t.Run("testEchoOneof2", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "GET", "/v1/example/echo2/golang", ""))
		if get(m, "no", "note") != "golang" {
			t.Errorf("no.note %v, want golang", m)
		}
	})
	t.Run("testEchoPathParamOverwrite", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "GET", "/v1/example/echo/resource/my_resource_id?resourceId=bad_resource_id", ""))
		if get(m, "resourceId") != "my_resource_id" {
			t.Errorf("resourceId %v, want my_resource_id", m)
		}
	})
	t.Run("testEchoNested", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "GET", "/v1/example/echo/nested/my_nested_id?n_id.val=foo", ""))
		if get(m, "nId", "val") != "foo" {
			t.Errorf("nId.val %v, want foo", m)
		}
	})
	t.Run("testEchoNestedOverride", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "GET", "/v1/example/echo/nested/my_nested_id?nId.nId=bad_id", ""))
		if get(m, "nId", "nId") != "my_nested_id" {
			t.Errorf("nId.nId %v, want my_nested_id", m)
		}
	})
	t.Run("testEchoBody", func(t *testing.T) {
		// sent as http.NewRequest sends it: no Content-Type
		r := n.rawReq(t, "POST", "/v1/example/echo_body", `{"id":"example"}`)
		m := msg(t, r)
		// as the upstream case compares: unmarshalled, zero values aside
		if nz, _ := dropZero(m).(map[string]any); len(nz) != 1 || get(m, "id") != "example" {
			t.Errorf("answer %v, want the message sent", m)
		}
		if got := r.hdr.Get("Grpc-Metadata-Foo"); got != "foo1" {
			t.Errorf("Grpc-Metadata-Foo %q, want foo1", got)
		}
		if got := r.hdr.Get("Grpc-Metadata-Bar"); got != "bar1" {
			t.Errorf("Grpc-Metadata-Bar %q, want bar1", got)
		}
	})
	t.Run("testEchoWithNonASCIIHeaderValues", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "POST", "/v1/example/echo/myid", "{}", "Content-Type", ct, "Grpc-Metadata-Location", "Gjøvik"))
		if get(m, "id") != "myid" {
			t.Errorf("id %v, want myid", m)
		}
	})
	t.Run("testEchoWithInvalidHeaderKey", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "POST", "/v1/example/echo/myid", "{}", "Content-Type", ct, "Grpc-Metadata-Foo+Bar", "Hello"))
		if get(m, "id") != "myid" {
			t.Errorf("id %v, want myid", m)
		}
	})
	t.Run("TestEchoUnauthorized", func(t *testing.T) {
		r := n.rawReq(t, "GET", "/v1/example/echo_unauthorized", "")
		expectError(t, "unauthorized", r, http.StatusUnauthorized, "unauthorized err")
		if r.hdr.Get("WWW-Authenticate") == "" {
			t.Error("WWW-Authenticate header should not be empty")
		}
	})
	t.Run("TestEchoPatch", func(t *testing.T) {
		// the upstream case sends proto names (UseProtoNames) and no Content-Type
		sent := `{"struct_field":{"struct_key":{"layered_struct_key":"struct_val"}},` +
			`"value_field":{"value_struct_key":"value_struct_val"}}`
		m := msg(t, n.rawReq(t, "PATCH", "/v1/example/echo_patch", sent))
		want := `{"structField":{"struct_key":{"layered_struct_key":"struct_val"}},"valueField":{"value_struct_key":"value_struct_val"}}`
		body, _ := json.Marshal(m["body"])
		if !jsonEqual(string(body), want) {
			t.Errorf("body %s, want %s", body, want)
		}
		// FieldMask's JSON form of the upstream case's paths
		// (struct_field.struct_key.layered_struct_key, value_field.value_struct_key)
		if got := get(m, "updateMask"); got != "structField.structKey.layeredStructKey,valueField.valueStructKey" {
			t.Errorf("updateMask %v, want structField.structKey.layeredStructKey,valueField.valueStructKey", got)
		}
	})
	t.Run("TestInvalidArgument", func(t *testing.T) {
		if r := n.rawReq(t, "GET", "/v1/example/echo/myid/not_int64", ""); r.status != http.StatusBadRequest {
			t.Errorf("status %d, want 400: %s", r.status, r.body)
		}
	})
	t.Run("TestUnknownPath", func(t *testing.T) {
		if r := n.rawReq(t, "POST", "/", "{}", "Content-Type", ct); r.status != http.StatusNotFound {
			t.Errorf("status %d, want 404: %s", r.status, r.body)
		}
	})
	t.Run("TestNotImplemented_is_405", func(t *testing.T) {
		r := n.rawReq(t, "GET", "/v1/example/echo/myid", "")
		if r.status != http.StatusMethodNotAllowed || r.hdr.Get("Allow") != "POST" {
			t.Errorf("GET on a POST route: %d, Allow %q, want 405 and POST (grpc-gateway answers 501)", r.status, r.hdr.Get("Allow"))
		}
	})
	t.Run("EchoStatus_same_name_from_two_packages", func(t *testing.T) {
		m := msg(t, n.rawReq(t, "POST", "/v1/example/echo_status", `{"id":"1","subStatus":{"code":5},"sub2Status":{"errorCode":"E"}}`))
		if get(m, "result") != "ok" || get(m, "subStatus", "code") != float64(5) || get(m, "sub2Status", "errorCode") != "E" {
			t.Errorf("answer %v", m)
		}
	})
}
