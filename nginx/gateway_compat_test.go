package nginx

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// compatServer plays the qrpc side of nginx/testdata/gateway/compat.proto:
// Update and Echo answer their request (so the test reads what the gateway
// sent), each answer carries the request's headers back as x-seen-<name>,
// and Sleep waits its ms.
func compatServer(t *testing.T) (string, chan string) {
	t.Helper()
	sleepTimeouts := make(chan string, 16)
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	echo := func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		resp.Body = req.Body
		for i := 0; i+1 < len(req.Headers); i += 2 {
			resp.Headers = append(resp.Headers, []byte("x-seen-"+string(req.Headers[i])), req.Headers[i+1])
		}
	}
	srv.Handle("Update", echo)
	srv.Handle("Echo", echo)
	srv.Handle("Sleep", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		seen := ""
		for i := 0; i+1 < len(req.Headers); i += 2 {
			if string(req.Headers[i]) == "grpc-timeout" {
				seen = string(req.Headers[i+1])
			}
		}
		select {
		case sleepTimeouts <- seen:
		default:
		}
		var ms uint64
		if num, typ, n := protowire.ConsumeTag(req.Body); n > 0 && num == 1 && typ == protowire.VarintType {
			ms, _ = protowire.ConsumeVarint(req.Body[n:])
		}
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
		}
	})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return a.String(), sleepTimeouts
}

// expectNonZero is expectJSON for answers that emit unpopulated fields:
// the fields that hold a zero value (null, 0, "", false, [], {}) are left
// out of both sides before they are compared.
func expectNonZero(t *testing.T, what string, r gwResp, status int, want string) {
	t.Helper()
	var got, exp any
	if r.status != status || json.Unmarshal([]byte(r.body), &got) != nil || json.Unmarshal([]byte(want), &exp) != nil ||
		!reflect.DeepEqual(dropZero(got), dropZero(exp)) {
		t.Errorf("%s: got %d %s\nwant %d %s (zero values aside)", what, r.status, r.body, status, want)
	}
}

func dropZero(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if e = dropZero(e); e != nil {
				out[k] = e
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	case []any:
		if len(x) == 0 {
			return nil
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = dropZero(e)
		}
		return out
	case string:
		// "0": a 64-bit integer's zero, a string in the JSON mapping
		if x == "" || x == "0" {
			return nil
		}
	case float64:
		if x == 0 {
			return nil
		}
	case bool:
		if !x {
			return nil
		}
	}
	return v
}

// maskPathsOf reads the paths of the FieldMask field num of the protobuf
// answer r.
func maskPathsOf(t *testing.T, r gwResp, num protowire.Number) []string {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var paths []string
	for b := []byte(r.body); len(b) > 0; {
		n, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			t.Fatalf("bad protobuf %x", r.body)
		}
		b = b[k:]
		k = protowire.ConsumeFieldValue(n, typ, b)
		if k < 0 {
			t.Fatalf("bad protobuf %x", r.body)
		}
		if n == num && typ == protowire.BytesType {
			fm, _ := protowire.ConsumeBytes(b)
			for len(fm) > 0 {
				_, _, tk := protowire.ConsumeTag(fm)
				p, pk := protowire.ConsumeBytes(fm[tk:])
				if tk < 0 || pk < 0 {
					t.Fatalf("bad FieldMask %x", fm)
				}
				paths = append(paths, string(p))
				fm = fm[tk+pk:]
			}
		}
		b = b[k:]
	}
	return paths
}

// rawReq sends a request with exactly the headers given (no Content-Type
// unless given).
func (n *nginxProc) rawReq(t *testing.T, method, path, body string, hdrs ...string) gwResp {
	t.Helper()
	req, err := http.NewRequest(method, n.url(path), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdrs); i += 2 {
		req.Header.Set(hdrs[i], hdrs[i+1])
	}
	resp, err := n.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		k, rerr := resp.Body.Read(buf)
		b.Write(buf[:k])
		if rerr != nil {
			break
		}
	}
	return gwResp{resp.StatusCode, b.String(), resp.Header}
}

// compatDir is a gateway test's nginx directory with compat.proto in it.
func compatDir(t *testing.T) string {
	dir := gatewayDir(t)
	b, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "testdata", "gateway", "compat.proto"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "compat.proto"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestGatewayCompat runs the behaviours of grpc-gateway's runtime that
// its clients rely on, with compat = "grpc-gateway" (/c/) and without it
// (/d/), each case named after the grpc-gateway integration test
// (examples/internal/integration/integration_test.go) it follows.
func TestGatewayCompat(t *testing.T) {
	dir := compatDir(t)
	addr, sleepTimeouts := compatServer(t)
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        local protos = { files = { "compat.proto" }, import_paths = { qt.proto_dir } }`,
			`        package.loaded.gw_c = assert(gateway.new{ upstream = qt.compat_addr, prefix = "/c",`,
			`            protos = protos, compat = "grpc-gateway", opts = qt.opts({ timeout = 10000 }) })`,
			`        package.loaded.gw_d = assert(gateway.new{ upstream = qt.compat_addr, prefix = "/d",`,
			`            protos = protos, opts = qt.opts({ timeout = 10000 }) })`,
		),
		Extra: map[string]string{"compat_addr": addr, "proto_dir": dir},
		Server: `
        location /c/ { content_by_lua_block { package.loaded.gw_c:serve() } }
        location /d/ { content_by_lua_block { package.loaded.gw_d:serve() } }`,
	})

	// testEchoBody: Go's http.NewRequest and many SDKs send a body with no
	// Content-Type; grpc-gateway reads it as JSON (its wildcard marshaler).
	t.Run("testEchoBody_no_content_type", func(t *testing.T) {
		body := `{"uuid":"e1","int32Value":3}`
		expectNonZero(t, "compat", n.rawReq(t, "POST", "/c/v1/echo", body), 200, body)
		if r := n.rawReq(t, "POST", "/d/v1/echo", body); r.status != 415 {
			t.Errorf("default mode: %d %s, want 415", r.status, r.body)
		}
		// nor any type it has no marshaler for: fetch() sends a string
		// body as text/plain
		ct := "text/plain;charset=UTF-8"
		expectNonZero(t, "compat, text/plain", n.rawReq(t, "POST", "/c/v1/echo", body, "Content-Type", ct), 200, body)
		if r := n.rawReq(t, "POST", "/d/v1/echo", body, "Content-Type", ct); r.status != 415 {
			t.Errorf("default mode, text/plain: %d %s, want 415", r.status, r.body)
		}
	})

	// TestABEPatch / TestPatchWithFieldMask...: a PATCH of a body field
	// without update_mask gets the mask of the fields the body sets.
	t.Run("TestABEPatch_update_mask_from_body", func(t *testing.T) {
		body := `{"int32Value":32,"nested":{"name":"n"},"struct_field":{"struct_key":{"layered_struct_key":1}},` +
			`"valueField":{"value_struct_key":"x"},"tags":["a"]}`
		r := n.rawReq(t, "PATCH", "/c/v1/things/u1", body, "Content-Type", "application/json")
		want := `{"thing":{"uuid":"u1","int32Value":32,"nested":{"name":"n"},"structField":{"struct_key":{"layered_struct_key":1}},` +
			`"valueField":{"value_struct_key":"x"},"tags":["a"]},` +
			`"updateMask":"int32Value,nested.name,structField.structKey.layeredStructKey,tags,valueField.valueStructKey"}`
		expectNonZero(t, "derived mask", r, 200, want)
		// the paths as the server gets them (the protobuf answer: the
		// request as it came): .proto names, a Struct's keys as written,
		// which FieldMask's JSON form could not carry
		r = n.rawReq(t, "PATCH", "/c/v1/things/u1", `{"structField":{"structKey":{"x":1}},"int32Value":3}`,
			"Content-Type", "application/json", "Accept", "application/x-protobuf")
		if got, want := maskPathsOf(t, r, 2), []string{"int32_value", "struct_field.structKey.x"}; !reflect.DeepEqual(got, want) {
			t.Errorf("update_mask paths %q, want %q", got, want)
		}
		// an Any ends a path, and must say its type
		r = n.rawReq(t, "PATCH", "/c/v1/things/u1", `{"extra":{"@type":"type.googleapis.com/google.protobuf.Duration","value":"1s"}}`,
			"Content-Type", "application/json", "Accept", "application/x-protobuf")
		if got, want := maskPathsOf(t, r, 2), []string{"extra"}; !reflect.DeepEqual(got, want) {
			t.Errorf("update_mask paths %q, want %q", got, want)
		}
		r = n.rawReq(t, "PATCH", "/c/v1/things/u1", `{"extra":{"value":"1s"}}`, "Content-Type", "application/json")
		expectError(t, "an Any without @type", r, 400, "extra: an Any needs its @type")
		r = n.rawReq(t, "PATCH", "/c/v1/things/u1?update_mask=note", `{"note":"x","int32Value":1}`, "Content-Type", "application/json")
		expectNonZero(t, "a mask in the query wins", r, 200, `{"thing":{"uuid":"u1","note":"x","int32Value":1},"updateMask":"note"}`)
		r = n.rawReq(t, "PATCH", "/d/v1/things/u1", `{"int32Value":32}`, "Content-Type", "application/json")
		expectJSON(t, "default mode: no mask", r, 200, `{"thing":{"uuid":"u1","int32Value":32}}`)
		r = n.rawReq(t, "PATCH", "/c/v1/things/u1", `{"nope":1}`, "Content-Type", "application/json")
		if r.status != 400 {
			t.Errorf("an unknown field in a PATCH body: %d %s, want 400", r.status, r.body)
		}
	})

	// The derived mask is the one grpc-gateway's FieldMaskFromRequestBody
	// builds (docs/gateway.md says so), as its releases since v2.32.0
	// build it: an empty object ends a path, a message field's (as every
	// v2 release has it: oneof_empty in its fieldmask_test.go) and, inside
	// a Struct or a Value, at any depth (buildPathsBlindly returns the
	// name for an empty object, and its loop takes only a populated object
	// as a level to descend). Releases up to v2.31 added no path for an
	// empty object inside a Struct or Value, so that {"structField": {}}
	// in a PATCH left the field as it was.
	t.Run("TestABEPatch_mask_as_FieldMaskFromRequestBody", func(t *testing.T) {
		for _, c := range []struct {
			body string
			want []string
		}{
			{`{"structField":{"a":{"b":1}},"int32Value":1}`, []string{"int32_value", "struct_field.a.b"}},
			{`{"structField":{},"int32Value":1}`, []string{"int32_value", "struct_field"}},
			{`{"structField":{"a":{},"b":2},"int32Value":1}`, []string{"int32_value", "struct_field.a", "struct_field.b"}},
			{`{"structField":{"a":{"b":{}}}}`, []string{"struct_field.a.b"}},
			{`{"valueField":{},"int32Value":1}`, []string{"int32_value", "value_field"}},
			{`{"nested":{},"int32Value":1}`, []string{"int32_value", "nested"}},
		} {
			r := n.rawReq(t, "PATCH", "/c/v1/things/u1", c.body, "Content-Type", "application/json", "Accept", "application/x-protobuf")
			if got := maskPathsOf(t, r, 2); !reflect.DeepEqual(got, c.want) {
				t.Errorf("%s: update_mask paths %q, want %q (grpc-gateway's)", c.body, got, c.want)
			}
		}
	})

	// TestABEWithHeader / testEchoOneof...: Grpc-Metadata-* request headers
	// become metadata (the prefix taken off), permanent HTTP headers travel
	// as grpcgateway-<name> (Authorization also as itself), and the
	// answer's metadata comes back as Grpc-Metadata-<name>.
	t.Run("TestMetadata_headers", func(t *testing.T) {
		front, err := url.Parse(n.url("/"))
		if err != nil {
			t.Fatal(err)
		}
		r := n.rawReq(t, "POST", "/c/v1/echo", `{"uuid":"m1"}`, "Content-Type", "application/json",
			"Grpc-Metadata-Foo", "bar", "Authorization", "Bearer t0k", "User-Agent", "sdk/1", "X-Other", "no")
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		for name, want := range map[string]string{
			"Grpc-Metadata-X-Seen-Foo":                       "bar",
			"Grpc-Metadata-X-Seen-Authorization":             "Bearer t0k",
			"Grpc-Metadata-X-Seen-Grpcgateway-Authorization": "Bearer t0k",
			"Grpc-Metadata-X-Seen-Grpcgateway-User-Agent":    "sdk/1",
			"Grpc-Metadata-X-Seen-Grpcgateway-Content-Type":  "application/json",
			"Grpc-Metadata-X-Seen-X-Forwarded-For":           "127.0.0.1",
			"Grpc-Metadata-X-Seen-X-Other":                   "",
			"Grpc-Metadata-X-Seen-Grpc-Metadata-Foo":         "",
			// Go's HTTP server keeps Host out of a request's headers:
			// grpc-gateway sends it only as x-forwarded-host
			"Grpc-Metadata-X-Seen-Grpcgateway-Host": "",
			"Grpc-Metadata-X-Seen-X-Forwarded-Host": front.Host,
		} {
			if got := r.hdr.Get(name); got != want {
				t.Errorf("%s: %q, want %q", name, got, want)
			}
		}
		// a proxy in front: its X-Forwarded-Host wins, its X-Forwarded-For
		// gets the client's address appended
		r = n.rawReq(t, "POST", "/c/v1/echo", `{"uuid":"m2"}`, "Content-Type", "application/json",
			"X-Forwarded-Host", "front.example", "X-Forwarded-For", "192.0.2.7")
		for name, want := range map[string]string{
			"Grpc-Metadata-X-Seen-X-Forwarded-Host": "front.example",
			"Grpc-Metadata-X-Seen-X-Forwarded-For":  "192.0.2.7, 127.0.0.1",
		} {
			if got := r.hdr.Get(name); got != want {
				t.Errorf("behind a proxy, %s: %q, want %q", name, got, want)
			}
		}
		r = n.rawReq(t, "POST", "/d/v1/echo", `{"uuid":"m1"}`, "Content-Type", "application/json", "Grpc-Metadata-Foo", "bar")
		for k := range r.hdr {
			if strings.HasPrefix(k, "Grpc-Metadata-") {
				t.Errorf("default mode answers %s", k)
			}
		}
	})

	// An error message quotes what the client sent (a query parameter's
	// name, a form value), whose bytes need not be UTF-8: the error body
	// stays UTF-8 JSON, each stray byte written as U+FFFD (as Go's
	// encoding/json writes it), in the gateway's words and in Go's.
	t.Run("error_message_not_utf8", func(t *testing.T) {
		const form = "application/x-www-form-urlencoded"
		for _, c := range []struct{ what, method, path, body string }{
			{"a query parameter's name", "GET", "/d/v1/sleep/1?%FF%00=1", ""},
			{"a form value", "POST", "/c/v1/echo", "int32_value=%FF%00"},
		} {
			r := n.rawReq(t, c.method, c.path, c.body, "Content-Type", form)
			if !utf8.ValidString(r.body) {
				t.Errorf("%s: the error body is not UTF-8: %q", c.what, r.body)
				continue
			}
			if e := expectError(t, c.what, r, 400); e != nil && !strings.Contains(e["message"].(string), "\ufffd") {
				t.Errorf("%s: message %q: want U+FFFD for the byte 0xFF", c.what, e["message"])
			}
		}
	})

	// ngx_lua decodes at most 100 URL arguments here: more is a 400 that
	// says so, not a request with the rest dropped.
	t.Run("more_than_100_arguments", func(t *testing.T) {
		const ct, form = "Content-Type", "application/x-www-form-urlencoded"
		var args []string
		for i := 0; i <= 100; i++ {
			args = append(args, "a"+strconv.Itoa(i)+"=1")
		}
		many := strings.Join(args, "&")
		expectError(t, "101 query parameters", n.rawReq(t, "GET", "/c/v1/sleep/1?"+many, ""), 400, "more than 100 query parameters")
		expectError(t, "101 form fields, body *", n.rawReq(t, "POST", "/c/v1/echo", many, ct, form), 400, "more than 100 form fields")
		// a form POST served by the GET route (grpc-gateway's path length fallback)
		expectError(t, "101 form fields, GET route", n.rawReq(t, "POST", "/c/v1/sleep/1", many, ct, form), 400, "more than 100 form fields")
		// 100 are read (and dropped under compat: they name no field)
		if r := n.rawReq(t, "GET", "/c/v1/sleep/1?"+strings.Join(args[:100], "&"), ""); r.status != 200 {
			t.Errorf("100 query parameters: %d %s, want 200", r.status, r.body)
		}
	})

	// A form-encoded body sets fields as the query string does.
	t.Run("form_body", func(t *testing.T) {
		form := url.Values{"uuid": {"f1"}, "int32_value": {"7"}, "tags": {"a", "b"}}.Encode()
		r := n.rawReq(t, "POST", "/c/v1/echo", form, "Content-Type", "application/x-www-form-urlencoded")
		expectNonZero(t, "form, body *", r, 200, `{"uuid":"f1","int32Value":7,"tags":["a","b"]}`)
		r = n.rawReq(t, "POST", "/c/v1/echo/f2/nested", "name=x&amount=3", "Content-Type", "application/x-www-form-urlencoded")
		expectNonZero(t, "form, body field", r, 200, `{"uuid":"f2","nested":{"name":"x","amount":3}}`)
		if r := n.rawReq(t, "POST", "/c/v1/echo", "int32_value=x", "Content-Type", "application/x-www-form-urlencoded"); r.status != 400 {
			t.Errorf("a bad form value: %d %s, want 400", r.status, r.body)
		}
		if r := n.rawReq(t, "POST", "/d/v1/echo", form, "Content-Type", "application/x-www-form-urlencoded"); r.status != 415 {
			t.Errorf("default mode, form: %d %s, want 415", r.status, r.body)
		}
	})

	// grpc-gateway's own tutorial calls its gateway with
	// `curl -X POST ... -d '{"name": " hello"}'`, and curl -d sends
	// Content-Type: application/x-www-form-urlencoded. grpc-gateway has no
	// form marshaler: its wildcard marshaler reads that body as JSON. Such
	// a request must not become a 200 whose message lost every field the
	// client sent (its JSON text read as one form key that names no field,
	// which discard_unknown then drops; for a PATCH also without a mask, a
	// whole replace with an empty message): grpc-gateway's answer, or a
	// 400 that says what is wrong.
	t.Run("tutorial_curl_d_json", func(t *testing.T) {
		for _, c := range []struct{ what, method, path, body, want string }{
			{"POST, body *", "POST", "/c/v1/echo", `{"uuid":"e1","int32Value":3}`, `{"uuid":"e1","int32Value":3}`},
			{"PATCH, body field", "PATCH", "/c/v1/things/u1", `{"int32Value":32}`,
				`{"thing":{"uuid":"u1","int32Value":32},"updateMask":"int32Value"}`},
		} {
			r := n.rawReq(t, c.method, c.path, c.body, "Content-Type", "application/x-www-form-urlencoded")
			if r.status == 400 {
				expectError(t, c.what, r, 400)
				continue
			}
			expectNonZero(t, c.what+", JSON text sent as curl -d sends it", r, 200, c.want)
		}
	})

	// A form body sets fields as the query string does, so the path wins
	// over it (docs/gateway.md: a parameter for a field the path sets is
	// ignored), and a form PATCH under patch_update_mask updates only the
	// fields it sends, as a JSON one does: the mask of the form's fields,
	// or a 400 (grpc-gateway reads no form on a route with a body).
	t.Run("form_body_PATCH", func(t *testing.T) {
		const ct = "Content-Type"
		r := n.rawReq(t, "PATCH", "/c/v1/things/u1", "uuid=fromform&int32_value=32", ct, "application/x-www-form-urlencoded")
		var got struct {
			Thing      struct{ UUID string }
			UpdateMask string
		}
		if r.status != 200 || json.Unmarshal([]byte(r.body), &got) != nil {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if got.Thing.UUID != "u1" {
			t.Errorf("thing.uuid %q, want the path's u1 (a form field set it over the path): %s", got.Thing.UUID, r.body)
		}
		r = n.rawReq(t, "PATCH", "/c/v1/things/u1", "int32_value=32", ct, "application/x-www-form-urlencoded")
		if r.status == 400 {
			expectError(t, "a form PATCH", r, 400)
			return
		}
		expectNonZero(t, "a form PATCH: the mask of the fields it sends", r, 200,
			`{"thing":{"uuid":"u1","int32Value":32},"updateMask":"int32Value"}`)
	})

	// A form-typed body on a route with a body, as the gateway reads it:
	// JSON text (leading white space allowed) as JSON, as grpc-gateway
	// reads it; a form's fields by their paths into the update_mask of a
	// PATCH (unknown ones dropped under compat), unless the query string
	// gives a mask; a body field that is no message, which no form can
	// set, as JSON under default_content_type (grpc-gateway), else a 415.
	t.Run("form_body_on_a_route_with_a_body", func(t *testing.T) {
		const ct, form = "Content-Type", "application/x-www-form-urlencoded"
		body := "\n {\"uuid\":\"e2\",\"tags\":[\"x\"]}"
		expectNonZero(t, "JSON text with white space first", n.rawReq(t, "POST", "/c/v1/echo", body, ct, form), 200,
			`{"uuid":"e2","tags":["x"]}`)
		if r := n.rawReq(t, "POST", "/d/v1/echo", body, ct, form); r.status != 415 {
			t.Errorf("default mode, JSON text as a form: %d %s, want 415", r.status, r.body)
		}
		pb := []string{ct, form, "Accept", "application/x-protobuf"}
		r := n.rawReq(t, "PATCH", "/c/v1/things/u1", "nested.name=n&int32_value=3&tags=a&tags=b&bogus=1", pb...)
		if got, want := maskPathsOf(t, r, 2), []string{"int32_value", "nested.name", "tags"}; !reflect.DeepEqual(got, want) {
			t.Errorf("a form PATCH: update_mask paths %q, want %q", got, want)
		}
		r = n.rawReq(t, "PATCH", "/c/v1/things/u1?update_mask=note", "int32_value=3", pb...)
		if got, want := maskPathsOf(t, r, 2), []string{"note"}; !reflect.DeepEqual(got, want) {
			t.Errorf("a form PATCH with update_mask in the query: paths %q, want the query's %q", got, want)
		}
		expectNonZero(t, "a JSON string as a form, body field note", n.rawReq(t, "POST", "/c/v1/echo/n1/note", `"hi"`, ct, form), 200,
			`{"uuid":"n1","note":"hi"}`)
		if r := n.rawReq(t, "POST", "/d/v1/echo/n1/note", "a=1", ct, form); r.status != 415 {
			t.Errorf("default mode, a form on body field note: %d %s, want 415", r.status, r.body)
		}
	})

	// grpc-gateway v2's default unmarshaler discards unknown fields
	// (DiscardUnknown: true), and it skips query parameters that name no
	// field.
	t.Run("DiscardUnknown", func(t *testing.T) {
		r := n.rawReq(t, "POST", "/c/v1/echo", `{"uuid":"k","nope":1}`, "Content-Type", "application/json")
		expectNonZero(t, "compat, an unknown body field", r, 200, `{"uuid":"k"}`)
		r = n.rawReq(t, "POST", "/c/v1/echo/k2/nested?nope=1", `{"name":"x"}`, "Content-Type", "application/json")
		expectNonZero(t, "compat, an unknown query parameter", r, 200, `{"uuid":"k2","nested":{"name":"x"}}`)
		r = n.rawReq(t, "POST", "/d/v1/echo", `{"uuid":"k","nope":1}`, "Content-Type", "application/json")
		expectError(t, "default mode, an unknown body field", r, 400, "nope: unknown field")
		r = n.rawReq(t, "POST", "/d/v1/echo/k2/nested?nope=1", `{"name":"x"}`, "Content-Type", "application/json")
		expectError(t, "default mode, an unknown query parameter", r, 400, `query parameter "nope"`)
	})

	// grpc-gateway v2 emits unpopulated fields (EmitUnpopulated: true).
	t.Run("EmitUnpopulated", func(t *testing.T) {
		r := n.rawReq(t, "POST", "/c/v1/echo", `{"uuid":"z"}`, "Content-Type", "application/json")
		expectJSON(t, "compat", r, 200,
			`{"uuid":"z","int32Value":0,"nested":null,"structField":null,"valueField":null,"tags":[],"note":"","extra":null}`)
		r = n.rawReq(t, "POST", "/d/v1/echo", `{"uuid":"z"}`, "Content-Type", "application/json")
		expectJSON(t, "default mode", r, 200, `{"uuid":"z"}`)
	})

	// TestTimeout: Grpc-Timeout caps the call (in both modes) and travels
	// to the server as grpc-timeout; an invalid one is 400.
	t.Run("TestTimeout_grpc_timeout", func(t *testing.T) {
		for len(sleepTimeouts) > 0 {
			<-sleepTimeouts
		}
		const sleepMS = 1000
		t0 := time.Now()
		r := n.rawReq(t, "GET", "/d/v1/sleep/"+strconv.Itoa(sleepMS), "", "Grpc-Timeout", "100m")
		took := time.Since(t0)
		expectError(t, "Grpc-Timeout 100m on a 1 s call", r, 504, "timeout")
		if took >= sleepMS*time.Millisecond {
			t.Errorf("504 after %v: the call waited for the server's %d ms, not the 100 ms Grpc-Timeout", took, sleepMS)
		}
		select {
		case seen := <-sleepTimeouts:
			ms, err := strconv.Atoi(strings.TrimSuffix(seen, "m"))
			if !strings.HasSuffix(seen, "m") || err != nil || ms > 100 || ms <= 0 {
				t.Errorf("the server saw grpc-timeout %q, want 1..100m", seen)
			}
		case <-time.After(10 * time.Second):
			t.Error("the server never got the call")
		}
		if r := n.rawReq(t, "GET", "/c/v1/sleep/1", "", "Grpc-Timeout", "10x"); r.status != 400 || !strings.Contains(r.body, "invalid grpc-timeout") {
			t.Errorf("Grpc-Timeout 10x: %d %s, want 400", r.status, r.body)
		}
		if r := n.rawReq(t, "GET", "/c/v1/sleep/1", "", "Grpc-Timeout", "123456789S"); r.status != 400 {
			t.Errorf("Grpc-Timeout of 9 digits: %d %s, want 400", r.status, r.body)
		}
		if r := n.rawReq(t, "GET", "/c/v1/sleep/1", "", "Grpc-Timeout", "0S"); r.status != 504 {
			t.Errorf("Grpc-Timeout 0S: %d %s, want 504", r.status, r.body)
		}
		if r := n.rawReq(t, "GET", "/c/v1/sleep/1", "", "Grpc-Timeout", "1H"); r.status != 200 {
			t.Errorf("Grpc-Timeout 1H (over the gateway's own timeout): %d %s, want 200", r.status, r.body)
		}
	})
}
