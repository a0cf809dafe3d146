package nginx

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

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

// namesServer plays, over qrpc, grpc-gateway's example NonStandardService
// (examples/internal/server/non_standard_names.go: each method applies
// the request's update_mask to an empty message and answers it) and, for
// TestRequestParseForm, EchoService's Echo (the request answered).
func namesServer(t *testing.T, sd protoreflect.ServiceDescriptor) string {
	t.Helper()
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	srv.Handle("Echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) { resp.Body = req.Body })
	for i := 0; i < sd.Methods().Len(); i++ {
		md := sd.Methods().Get(i)
		srv.Handle(string(md.Name()), func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
			in := dynamicpb.NewMessage(md.Input())
			if err := proto.Unmarshal(req.Body, in); err != nil {
				resp.Code, resp.Body = 3, []byte(err.Error())
				return
			}
			var paths []string
			if mf := field(in, "update_mask"); in.Has(mf) {
				pl := in.Get(mf).Message()
				l := pl.Get(field(pl, "paths")).List()
				for j := 0; j < l.Len(); j++ {
					paths = append(paths, l.Get(j).String())
				}
			}
			out := dynamicpb.NewMessage(md.Output())
			applyFieldMask(out, in.Get(field(in, "body")).Message(), paths)
			resp.Body, _ = proto.Marshal(out)
		})
	}
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return a.String()
}

// TestGrpcGatewayNames runs grpc-gateway's TestNonStandardNames and
// TestRequestParseForm (examples/internal/integration/integration_test.go)
// against two gateways, as the upstream test runs two: one with
// proto_names (its UseProtoNames marshaler, on port 8081 there) and one
// with the default naming (port 8082), both compat = "grpc-gateway",
// serving non_standard_names.proto and echo_service.proto in front of
// namesServer. A PATCH body that names fields in any casing the schema
// allows gets the update_mask of their .proto names (en_GB, Num,
// thing.subThing.sub_value), and a form body on a binding without body
// sets fields as the query string does.
func TestGrpcGatewayNames(t *testing.T) {
	dir := grpcGatewayProtos(t)
	b, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "testdata", "gateway", "non_standard_names.proto"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "non_standard_names.proto"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	fd := compileProto(t, []string{dir}, "non_standard_names.proto")
	echoMD := compileProto(t, []string{dir}, "examples/internal/proto/examplepb/echo_service.proto").
		Messages().ByName("SimpleMessage")
	addr := namesServer(t, fd.Services().ByName("NonStandardService"))
	gw := func(extra string) *nginxProc {
		return startNginx(t, ngxConf{
			Workers: 1,
			InitByLua: lines(
				`        local qrpc = require "resty.ffi.qrpc"`,
				`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
				`        local gateway = require "resty.ffi.qrpc.gateway"`,
				`        local qt = require "qtest"`,
				`        package.loaded.gw = assert(gateway.new{ upstream = qt.names_addr,`,
				`            protos = { files = { "non_standard_names.proto",`,
				`                                 "examples/internal/proto/examplepb/echo_service.proto" },`,
				`                       import_paths = { qt.proto_dir } },`,
				`            compat = "grpc-gateway", codes = "grpc", opts = qt.opts({ timeout = 10000 }),`,
				`            `+extra+` })`,
			),
			Extra:  map[string]string{"names_addr": addr, "proto_dir": dir},
			Server: `        location / { content_by_lua_block { package.loaded.gw:serve() } }`,
		})
	}
	protoNames, plain := gw("proto_names = true"), gw("")
	// want: the upstream case's message, here in protojson with .proto names
	want := `{"id":"foo","Num":"1","line_num":"42","langIdent":"English","STATUS":"good","en_GB":"1","no":"yes",` +
		`"thing":{"subThing":{"sub_value":"hi"}}}`

	for _, tc := range []struct {
		name   string
		gw     *nginxProc
		method string
		body   string
	}{
		{"Test standard update method", protoNames, "update",
			`{"id":"foo","Num":"1","line_num":"42","langIdent":"English","STATUS":"good","en_GB":"1","no":"yes",` +
				`"thing":{"subThing":{"sub_value":"hi"}}}`},
		{"Test update method using json_names in message", protoNames, "update_with_json_names",
			`{"id":"foo","Num":"1","line_num":"42","langIdent":"English","STATUS":"good","en_GB":"1","no":"yes",` +
				`"thing":{"subThing":{"sub_value":"hi"}}}`},
		{"Test standard update method with UseProtoNames: false marshaller option", plain, "update",
			`{"id":"foo","Num":"1","lineNum":"42","langIdent":"English","STATUS":"good","enGB":"1","no":"yes",` +
				`"thing":{"subThing":{"subValue":"hi"}}}`},
		{"Test update method using json_names in message with UseProtoNames: false marshaller option", plain, "update_with_json_names",
			`{"ID":"foo","Num":"1","LineNum":"42","langIdent":"English","status":"good","En_GB":"1","yes":"yes",` +
				`"Thingy":{"SubThing":{"sub_Value":"hi"}}}`},
	} {
		t.Run("TestNonStandardNames/"+tc.name, func(t *testing.T) {
			// as http.NewRequest sends it: no Content-Type
			r := tc.gw.rawReq(t, "PATCH", "/v1/example/non_standard/"+tc.method, tc.body)
			if r.status != 200 {
				t.Fatalf("patchResp.StatusCode= %d; want 200 resp: %v", r.status, r.body)
			}
			md := fd.Messages().ByName("NonStandardMessage")
			if tc.method == "update_with_json_names" {
				md = fd.Messages().ByName("NonStandardMessageWithJSONNames")
			}
			got, exp := dynamicpb.NewMessage(md), dynamicpb.NewMessage(md)
			if err := protojson.Unmarshal([]byte(r.body), got); err != nil {
				t.Fatalf("marshaler.Unmarshal failed: %v: %s", err, r.body)
			}
			if err := protojson.Unmarshal([]byte(want), exp); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, exp) {
				t.Errorf("got %s\nwant %s", r.body, want)
			}
		})
	}

	for name, n := range map[string]*nginxProc{"proto_names": protoNames, "default": plain} {
		t.Run("TestRequestParseForm/"+name, func(t *testing.T) {
			r := n.rawReq(t, "POST", "/v1/example/echo/myid1", "num=1", "Content-Type", "application/x-www-form-urlencoded")
			if r.status != 200 {
				t.Fatalf("resp.StatusCode = %d; want 200: %s", r.status, r.body)
			}
			msg := dynamicpb.NewMessage(echoMD)
			if err := protojson.Unmarshal([]byte(r.body), msg); err != nil {
				t.Fatalf("%v: %s", err, r.body)
			}
			if id, num := msg.Get(field(msg, "id")).String(), msg.Get(field(msg, "num")).Int(); id != "myid1" || num != 1 {
				t.Errorf("id %q num %d, want myid1 and 1: %s", id, num, r.body)
			}
		})
	}
}
