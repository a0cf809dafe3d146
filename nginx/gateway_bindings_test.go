package nginx

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestGatewayBadBindingCostsOneRoute loads a .proto with a binding the
// gateway cannot serve (a nested body field): it is skipped with one error line naming the file, the method and the
// rule, left out of the OpenAPI document under x-qrpc-skipped, and every
// other route serves, among them a verb with a colon ("{id}:custom:custom",
// read as grpc-gateway reads it) and a repeated field in the path (which
// http.proto forbids and grpc-gateway serves: values joined with ","). A 401 carries WWW-Authenticate.
func TestGatewayBadBindingCostsOneRoute(t *testing.T) {
	dir := gatewayDir(t)
	b, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "testdata", "gateway", "partial.proto"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "partial.proto"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	// Good and DoubleColon echo the request message; Secret refuses.
	echo := func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) { resp.Body = req.Body }
	srv.Handle("Good", echo)
	srv.Handle("DoubleColon", echo)
	srv.Handle("RepeatedPath", echo)
	srv.Handle("Secret", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		resp.Code, resp.Body = 16, []byte("token expired")
		// the request message is Msg{id}: field 1, length-delimited
		if strings.HasSuffix(string(req.Body), "hdr") {
			resp.Headers = [][]byte{[]byte("www-authenticate"), []byte(`Bearer realm="shop"`)}
		}
	})
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
			`        package.loaded.gw = assert(gateway.new{`,
			`            upstream = qt.addr2, prefix = "/p", codes = "grpc", openapi = true,`,
			`            protos = { files = { "partial.proto" }, import_paths = { qt.proto_dir } },`,
			`            opts = qt.opts({ timeout = 10000 }),`,
			`        })`,
		),
		Extra: map[string]string{"addr2": a.String(), "proto_dir": dir},
		Server: `
        location /p/ { content_by_lua_block { package.loaded.gw:serve() } }`,
		AllowErrors: []string{`qrpc gateway: skipped `},
	})

	expectJSON(t, "a good route", n.req(t, "GET", "/p/v1/good/g1", ""), 200, `{"id":"g1"}`)
	expectJSON(t, "a verb with a colon", n.req(t, "POST", "/p/v2/things/t1:custom:custom", `{"tags":["x"]}`),
		200, `{"id":"t1","tags":["x"]}`)
	if r := n.req(t, "POST", "/p/v2/things/t1:custom", `{}`); r.status != 404 {
		t.Errorf("half the verb: %d %s, want 404", r.status, r.body)
	}
	expectJSON(t, "a repeated field in the path", n.req(t, "GET", "/p/v1/tags/x,y", ""), 200, `{"tags":["x","y"]}`)
	if r := n.req(t, "GET", "/p/v1/nested", ""); r.status != 404 {
		t.Errorf("/p/v1/nested (skipped): %d %s, want 404", r.status, r.body)
	}

	r := n.req(t, "GET", "/p/v1/secret/s1", "")
	expectError(t, "401", r, 401, "token expired")
	if got := r.hdr.Get("WWW-Authenticate"); got != "token expired" {
		t.Errorf("401 without the service's challenge: WWW-Authenticate %q, want the message", got)
	}
	r = n.req(t, "GET", "/p/v1/secret/hdr", "")
	if got := r.hdr.Get("WWW-Authenticate"); r.status != 401 || got != `Bearer realm="shop"` {
		t.Errorf("401 with the service's challenge: %d, WWW-Authenticate %q", r.status, got)
	}

	r = n.req(t, "GET", "/p/openapi.json", "")
	if r.status != 200 {
		t.Fatalf("openapi.json: %d %s", r.status, r.body)
	}
	validateOpenAPI(t, []byte(r.body))
	var tagsDoc struct {
		Paths map[string]struct {
			Get struct {
				Parameters []struct {
					Name   string
					Schema struct {
						Type  string
						Items struct{ Type string }
					}
				}
			}
		}
	}
	_ = json.Unmarshal([]byte(r.body), &tagsDoc)
	if ps := tagsDoc.Paths["/p/v1/tags/{tags}"].Get.Parameters; len(ps) == 0 || ps[0].Name != "tags" ||
		ps[0].Schema.Type != "array" || ps[0].Schema.Items.Type != "string" {
		t.Errorf("the repeated path parameter tags: %+v, want an array of strings", ps)
	}
	var doc struct {
		Paths   map[string]any `json:"paths"`
		Skipped []struct {
			Rule, Method, File, Reason string
		} `json:"x-qrpc-skipped"`
	}
	if err := json.Unmarshal([]byte(r.body), &doc); err != nil {
		t.Fatal(err)
	}
	var paths, skipped []string
	for p := range doc.Paths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	if want := []string{"/p/v1/good/{id}", "/p/v1/secret/{id}", "/p/v1/tags/{tags}", "/p/v2/things/{id}:custom:custom"}; strings.Join(paths, " ") != strings.Join(want, " ") {
		t.Errorf("OpenAPI paths %v, want %v", paths, want)
	}
	for _, s := range doc.Skipped {
		if s.File != "partial.proto" || s.Reason == "" {
			t.Errorf("x-qrpc-skipped entry %+v: want the file and a reason", s)
		}
		skipped = append(skipped, s.Method+" "+s.Rule)
	}
	sort.Strings(skipped)
	if want := []string{"gwpartial.Partial.NestedBody POST /p/v1/nested"}; strings.Join(skipped, "|") != strings.Join(want, "|") {
		t.Errorf("x-qrpc-skipped %v, want %v", skipped, want)
	}
	for _, re := range []string{
		`qrpc gateway: skipped POST /p/v1/nested of gwpartial\.Partial\.NestedBody \(partial\.proto\): body: no field payload\.input_value`,
	} {
		if c := n.logCount(re); c != 1 {
			t.Errorf("error.log has %d lines matching %s, want 1 (the worker builds its routes once)", c, re)
		}
	}
}
