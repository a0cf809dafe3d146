package nginx

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	// google/api/annotations.proto for the test's own compile of shop.proto
	_ "google.golang.org/genproto/googleapis/api/annotations"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

// shopServer serves nginx/testdata/gateway/shop.proto with dynamic
// messages: handlers decode what the gateway sent with a descriptor
// compiled here, independently of the library.
type shopServer struct {
	addr string
	srv  *qrpc.Server

	mu      sync.Mutex
	methods []string // qrpc method names seen, in order
}

func (s *shopServer) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.methods...)
}

func compileShop(t *testing.T, dir string) protoreflect.ServiceDescriptor {
	t.Helper()
	global := protocompile.ResolverFunc(func(p string) (protocompile.SearchResult, error) {
		fd, err := protoregistry.GlobalFiles.FindFileByPath(p)
		if err != nil {
			return protocompile.SearchResult{}, err
		}
		return protocompile.SearchResult{Desc: fd}, nil
	})
	comp := protocompile.Compiler{Resolver: protocompile.CompositeResolver{
		&protocompile.SourceResolver{ImportPaths: []string{dir}}, global,
	}}
	files, err := comp.Compile(context.Background(), "shop.proto")
	if err != nil {
		t.Fatal(err)
	}
	return files[0].Services().ByName("Shop")
}

func startShopServer(t *testing.T, sd protoreflect.ServiceDescriptor, addr string) *shopServer {
	t.Helper()
	s := &shopServer{srv: qrpc.NewServer(&qrpc.ServerConfig{})}
	mds := sd.Methods()
	for i := 0; i < mds.Len(); i++ {
		md := mds.Get(i)
		h := s.handler(md)
		s.srv.Handle(string(md.Name()), h)
		s.srv.Handle(string(sd.FullName())+"/"+string(md.Name()), h)
	}
	a, err := s.srv.Listen(addr, qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.srv.Close() })
	s.addr = a.String()
	return s
}

func (s *shopServer) handler(md protoreflect.MethodDescriptor) qrpc.Handler {
	return func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.mu.Lock()
		s.methods = append(s.methods, string(req.Method))
		s.mu.Unlock()
		in := dynamicpb.NewMessage(md.Input())
		if err := proto.Unmarshal(req.Body, in); err != nil {
			resp.Code, resp.Body = 3, []byte("not a "+string(md.Input().FullName()))
			return
		}
		inJSON, _ := protojson.Marshal(in)
		get := func(name string) protoreflect.Value {
			return in.Get(md.Input().Fields().ByName(protoreflect.Name(name)))
		}
		// every request header comes back as x-echo-<name>
		for i := 0; i+1 < len(req.Headers); i += 2 {
			resp.Headers = append(resp.Headers, []byte("x-echo-"+string(req.Headers[i])), req.Headers[i+1])
		}
		answer := func(js string) {
			out := dynamicpb.NewMessage(md.Output())
			if err := protojson.Unmarshal([]byte(js), out); err != nil {
				resp.Code, resp.Body = 13, []byte("test server: "+err.Error())
				return
			}
			resp.Body, _ = proto.Marshal(out)
		}
		q := strconv.Quote
		switch md.Name() {
		case "GetItem":
			id, shelf := get("id").String(), get("shelf").String()
			resp.Headers = append(resp.Headers, []byte("x-item-id"), []byte(id), []byte("y-other"), []byte("no"))
			answer(`{"name":` + q("shelves/"+shelf+"/items/"+id) + `,"id":` + q(id) +
				`,"price":"9007199254740993","color":"COLOR_RED","tags":["a","b"],"created":"2024-02-29T12:00:00Z"}`)
		case "ListItems":
			if get("parent").String() == "shelves/empty" {
				answer(`{"nextPageToken":"end"}`)
				return
			}
			answer(`{"items":[{"name":` + q(get("parent").String()+"/items/1") + `,"title":` + q(string(inJSON)) + `}],"nextPageToken":"t"}`)
		case "CreateItem":
			item := get("item").Message().Interface()
			b, _ := protojson.Marshal(item)
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			m["name"] = "shelves/" + get("shelf").String() + "/items/new"
			b, _ = json.Marshal(m)
			answer(string(b))
		case "UpdateItem":
			item := get("item").Message().Interface()
			b, _ := protojson.Marshal(item)
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			if mask := get("update_mask").String(); mask != "" {
				m["tags"] = []string{mask}
			}
			b, _ = json.Marshal(m)
			answer(string(b))
		case "DeleteItem":
			answer(`{}`)
		case "Fail":
			code := uint32(get("code").Int())
			text := get("text").String()
			resp.Code, resp.Body = code, []byte(text)
			if text == "binary" {
				resp.Body = []byte("\xff\x00\x01")
			}
		case "Garbage":
			resp.Body = []byte("\xff\x00 not protobuf")
		case "Slow":
			select {
			case <-time.After(time.Duration(get("ms").Int()) * time.Millisecond):
			case <-ctx.Done():
			}
			answer(`{}`)
		default: // Echo, GetFile, Wild, Cancel, Search, Internal
			resp.Body = req.Body
		}
	}
}

// gatewayDir copies shop.proto where nginx's workers can read it.
func gatewayDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qgw-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "testdata", "gateway", "shop.proto"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "shop.proto"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// gwResp is one answer of the gateway.
type gwResp struct {
	status int
	body   string
	hdr    http.Header
}

func (n *nginxProc) req(t *testing.T, method, path, body string, hdrs ...string) gwResp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, n.url(path), rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdrs); i += 2 {
		req.Header.Set(hdrs[i], hdrs[i+1])
	}
	resp, err := n.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return gwResp{resp.StatusCode, string(b), resp.Header}
}

// jsonEqual compares two JSON texts as values.
func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func expectJSON(t *testing.T, what string, r gwResp, status int, want string) {
	t.Helper()
	if r.status != status || !jsonEqual(r.body, want) {
		t.Errorf("%s: got %d %s\nwant %d %s", what, r.status, r.body, status, want)
		return
	}
	if ct := r.hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", what, ct)
	}
}

// expectError checks the error shape and that message contains each of parts.
func expectError(t *testing.T, what string, r gwResp, status int, parts ...string) map[string]any {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.status != status {
		t.Errorf("%s: got %d %s, want %d and a JSON error", what, r.status, r.body, status)
		return nil
	}
	msg, _ := e["message"].(string)
	if _, ok := e["code"].(float64); !ok || e["details"] == nil || len(e) != 3 {
		t.Errorf("%s: error shape %s", what, r.body)
	}
	if d, ok := e["details"].([]any); !ok || len(d) != 0 {
		t.Errorf("%s: details %s", what, r.body)
	}
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("%s: message %q does not contain %q", what, msg, p)
		}
	}
	if ct := r.hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", what, ct)
	}
	return e
}

// gatewayLua is the init_by_lua of TestGateway: the gateways, made once
// in the master, served by every worker.
func gatewayInit(dir string) string {
	return lines(
		`        local qrpc = require "resty.ffi.qrpc"`,
		`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
		`        local gateway = require "resty.ffi.qrpc.gateway"`,
		`        local qt = require "qtest"`,
		`        local protos = { files = { "shop.proto" }, import_paths = { "`+dir+`" } }`,
		`        package.loaded.gw_main = assert(gateway.new{`,
		`            upstream = qt.shop_addr, opts = qt.opts({ timeout = tonumber(qt.call_timeout) }),`,
		`            protos = protos, prefix = "/api", openapi = { title = "Shop", version = "2.0" },`,
		`            codes = { [5] = 404 }, max_body = 1024,`,
		`            forward_headers = { "x-request-id", "x-fwd-*" }, response_headers = { "x-*" },`,
		`            routes = {`,
		`                ["POST /v1/internal"] = "gwtest.Shop.Internal",`,
		`                ["GET /v1/internal/{path}"] = { method = "gwtest.Shop/Internal", response_body = "path" },`,
		`                ["GET /v1/items/{id}"] = { method = "gwtest.Shop.GetItem" },`,
		`            },`,
		`        })`,
		`        package.loaded.gw_full = assert(gateway.new{`,
		`            upstream = { qt.shop_addr }, opts = qt.opts(), protos = protos, prefix = "/full",`,
		`            method_name = "full", codes = "grpc", discard_unknown = true, proto_names = true,`,
		`        })`,
		`        package.loaded.gw_down = assert(gateway.new{`,
		`            upstream = qt.down_addr, opts = qt.opts({ timeout = 2000 }), protos = protos,`,
		`            prefix = "/down", retry_after = 7,`,
		`        })`,
		`        package.loaded.gw_lost = assert(gateway.new{`,
		`            upstream = qt.lost_addr, opts = qt.opts({ timeout = 20000 }), protos = protos,`,
		`            prefix = "/lost",`,
		`        })`,
		`        package.loaded.gw_slow = assert(gateway.new{`,
		`            upstream = qt.shop_addr, opts = qt.opts({ timeout = 1000 }), protos = protos,`,
		`            prefix = "/slowgw",`,
		`        })`,
		`        package.loaded.gw_pool = assert(gateway.new{`,
		`            upstream = { qt.pool_a, qt.pool_b }, protos = protos, prefix = "/pool",`,
		`            opts = qt.opts({ timeout = 5000, retries = 2, health = { failures = 1, eject = 60000 } }),`,
		`        })`,
	)
}

const gatewayServer = `
        location /api/ {
            set $qrpc_method "";
            set $qrpc_route "";
            content_by_lua_block { package.loaded.gw_main:serve() }
            header_filter_by_lua_block {
                ngx.header["X-Method"] = ngx.var.qrpc_method
                ngx.header["X-Route"] = ngx.var.qrpc_route
            }
        }
        location /full/ { content_by_lua_block { package.loaded.gw_full:serve() } }
        location /down/ { content_by_lua_block { package.loaded.gw_down:serve() } }
        location /lost/ { content_by_lua_block { package.loaded.gw_lost:serve() } }
        location /pool/ { content_by_lua_block { package.loaded.gw_pool:serve() } }
        location /slowgw/ { content_by_lua_block { package.loaded.gw_slow:serve() } }
        location = /badconf {
            content_by_lua_block {
                local gateway = require "resty.ffi.qrpc.gateway"
                local qt = require "qtest"
                local protos = { files = { "shop.proto" }, import_paths = { qt.proto_dir } }
                local function try(c)
                    local gw, err = gateway.new(c)
                    local doc = gw and gw:openapi()
                    local skipped = doc and doc["x-qrpc-skipped"]
                    ngx.say(not gw and err or skipped and ("skipped " .. skipped[1].rule .. " of "
                            .. skipped[1].method .. " (" .. skipped[1].file .. "): "
                            .. skipped[1].reason) or "ok")
                end
                try("x")
                try({ upstream = qt.shop_addr, protos = protos, tiemout = 1 })
                try({ upstream = 1, protos = protos })
                try({ upstream = qt.shop_addr, protos = protos, opts = { ca = "" } })
                try({ upstream = qt.shop_addr, protos = protos, opts = { conns = 0 } })
                try({ upstream = { qt.shop_addr, qt.shop_addr }, protos = protos })
                try({ upstream = { qt.shop_addr, "bad" }, protos = protos })
                try({ upstream = "bad", protos = protos })
                try({ upstream = { qt.shop_addr, "bad:0" }, protos = protos, opts = { ca = "" } })
                try({ upstream = qt.shop_addr, protos = protos, opts = { methods = { Nope = { try_timeout = -1 } } } })
                try({ upstream = qt.shop_addr })
                try({ upstream = qt.shop_addr, protos = protos, method_name = "long" })
                try({ upstream = qt.shop_addr, protos = protos, prefix = "api/" })
                try({ upstream = qt.shop_addr, protos = protos, codes = { [5] = 99 } })
                try({ upstream = qt.shop_addr, protos = protos, max_body = -1 })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["/v1/x"] = "a.B.C" } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["GET /v1/{x"] = "a.B.C" } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["GET /v1/x"] = "gwtest.Shop.Nope" } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["GET /v1/{nope}"] = "gwtest.Shop.Internal" } })
                try({ upstream = qt.shop_addr, protos = protos, forward_headers = { "a*b" } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["GET /v1/**/x"] = "a.B.C" } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["GET /v1/{a}/{a}"] = "a.B.C" } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["GET /v1/{a=}"] = "a.B.C" } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["GET /v1/x:"] = "a.B.C" } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["GET /v1/x"] = { method = "a.B.C", bdy = "*" } } })
                try({ upstream = qt.shop_addr, protos = protos, routes = { ["POST /v1/x"] = { method = "gwtest.Shop.Echo", body = "nope" } } })
                try({ upstream = qt.shop_addr, protos = { files = { "absent.proto" }, import_paths = { qt.proto_dir } } })
                try({ upstream = qt.shop_addr, protos = protos })
            }
        }
`

func TestGateway(t *testing.T) {
	t.Parallel()
	dir := gatewayDir(t)
	sd := compileShop(t, dir)
	shop := startShopServer(t, sd, "127.0.0.1:0")
	lost := startShopServer(t, sd, "127.0.0.1:0")
	poolA := startShopServer(t, sd, "127.0.0.1:0")
	poolB := startShopServer(t, sd, "127.0.0.1:0")
	down := startShopServer(t, sd, "127.0.0.1:0")
	downAddr := down.addr
	_ = down.srv.Close() // nothing listens there

	// The calls' timeout: 10 s, far above any answer of a busy machine,
	// but for /slowgw/ (1 s), where the handler takes 60 s.
	n := startNginx(t, ngxConf{
		Workers:   2,
		InitByLua: gatewayInit(dir),
		Extra: map[string]string{
			"shop_addr": shop.addr, "down_addr": downAddr, "lost_addr": lost.addr,
			"pool_a": poolA.addr, "pool_b": poolB.addr, "proto_dir": dir, "call_timeout": "10000",
		},
		Server: gatewayServer,
		AllowErrors: []string{
			`qrpc gateway: skipped (GET /v1/x|GET /v1/\{nope\}|POST /v1/x) of `,
			`bad proto: .*absent.proto`,
		},
	})

	t.Run("routes", func(t *testing.T) {
		r := n.req(t, "GET", "/api/v1/items/42", "")
		expectJSON(t, "GetItem", r, 200, `{"name":"shelves//items/42","id":"42","price":"9007199254740993",
			"color":"COLOR_RED","tags":["a","b"],"created":"2024-02-29T12:00:00Z"}`)
		if r.hdr.Get("X-Item-Id") != "42" || r.hdr.Get("Y-Other") != "" {
			t.Errorf("response headers: %v", r.hdr)
		}
		if r.hdr.Get("X-Method") != "GetItem" || r.hdr.Get("X-Route") != "GET /api/v1/items/{id}" {
			t.Errorf("qrpc_method, qrpc_route: %q %q", r.hdr.Get("X-Method"), r.hdr.Get("X-Route"))
		}
		// HEAD answers as GET, without a body
		if r := n.req(t, "HEAD", "/api/v1/items/42", ""); r.status != 200 || r.body != "" {
			t.Errorf("HEAD: %d %q", r.status, r.body)
		}
		// additional_bindings
		expectJSON(t, "GetItem (additional binding)", n.req(t, "GET", "/api/v1/shelves/s1/items/42?brief=true", ""), 200,
			`{"name":"shelves/s1/items/42","id":"42","price":"9007199254740993","color":"COLOR_RED","tags":["a","b"],"created":"2024-02-29T12:00:00Z"}`)
		// {parent=shelves/*}, response_body, repeated enums by repetition, json names
		r = n.req(t, "GET", "/api/v1/shelves/s1/items?pageSize=5&colors=COLOR_RED&colors=2", "")
		var items []map[string]string
		if err := json.Unmarshal([]byte(r.body), &items); err != nil || r.status != 200 || len(items) != 1 {
			t.Fatalf("ListItems: %d %s", r.status, r.body)
		}
		if items[0]["name"] != "shelves/s1/items/1" || !jsonEqual(items[0]["title"], `{"parent":"shelves/s1","pageSize":5,"colors":["COLOR_RED","COLOR_GREEN"]}`) {
			t.Errorf("ListItems: %s", r.body)
		}
		expectJSON(t, "response_body of an empty list", n.req(t, "GET", "/api/v1/shelves/empty/items?page_size=1", ""), 200, `[]`)
		// body: "item", path into the body's message
		expectJSON(t, "CreateItem", n.req(t, "POST", "/api/v1/shelves/s1/items", `{"title":"x","price":"5","tags":[]}`), 200,
			`{"name":"shelves/s1/items/new","title":"x","price":"5"}`)
		expectJSON(t, "UpdateItem", n.req(t, "PATCH", "/api/v1/shelves/s1/items/7?updateMask=title", `{"title":"t2","name":"ignored","price":12}`), 200,
			`{"name":"shelves/s1/items/7","title":"t2","price":"12","tags":["title"]}`)
		expectJSON(t, "UpdateItem, no body", n.req(t, "PATCH", "/api/v1/shelves/s1/items/7", ""), 200, `{"name":"shelves/s1/items/7"}`)
		expectJSON(t, "DeleteItem", n.req(t, "DELETE", "/api/v1/items/9", ""), 200, `{}`)
		// hand routes: one replaces the schema's GET /v1/items/{id} (same method)
		expectJSON(t, "hand route, body *", n.req(t, "POST", "/api/v1/internal", `{"path":"p"}`), 200, `{"path":"p"}`)
		expectJSON(t, "hand route, response_body", n.req(t, "GET", "/api/v1/internal/a%20b", ""), 200, `"a b"`)
		// **, a kept %2F, an empty tail
		expectJSON(t, "**", n.req(t, "GET", "/api/v1/files/a/b/c.txt", ""), 200, `{"path":"a/b/c.txt"}`)
		expectJSON(t, "** with %2F", n.req(t, "GET", "/api/v1/files/a%2Fb/c%20d", ""), 200, `{"path":"a%2Fb/c d"}`)
		expectJSON(t, "** empty", n.req(t, "GET", "/api/v1/files/", ""), 200, `{}`)
		expectJSON(t, "unnamed *", n.req(t, "GET", "/api/v1/wild/any/p1", ""), 200, `{"path":"p1"}`)
		expectJSON(t, "custom verb", n.req(t, "POST", "/api/v1/jobs/j1:cancel", `{}`), 200, `{"path":"j1"}`)
		expectJSON(t, "custom verb, number", n.req(t, "GET", "/api/v1/echo/12:count", ""), 200, `{"count":12}`)
		expectJSON(t, "custom method", n.req(t, "SEARCH", "/api/v1/files", `{"path":"q"}`), 200, `{"path":"q"}`)
	})

	t.Run("fields", func(t *testing.T) {
		all := `{"id":"x","count":-3,"big":"-9223372036854775808","ubig":"18446744073709551615","flag":true,
			"ratio":0.1,"small":1.5,"color":"COLOR_GREEN","tags":["a","b"],"nums":[1,2],"colors":["COLOR_RED"],
			"flags":[true,false],"nested":{"label":"l","depth":2,"marks":["1","-2"]},"labels":{"k":"v","é":"ü"},
			"byNum":{"7":{"label":"seven"}},"data":"AAEC/w==","at":"2024-01-02T03:04:05.500Z",
			"list":[{"label":"a"},{}],"maybe":0}`
		expectJSON(t, "Echo, body *", n.req(t, "POST", "/api/v1/echo", all), 200, all)
		expectJSON(t, "Echo, charset", n.req(t, "POST", "/api/v1/echo", `{"id":"c"}`, "Content-Type", "application/json; charset=UTF-8"), 200, `{"id":"c"}`)
		expectJSON(t, "Echo, empty body", n.req(t, "POST", "/api/v1/echo", ""), 200, `{}`)
		// body * with a path variable: the path wins over the body
		expectJSON(t, "PUT body * + path", n.req(t, "PUT", "/api/v1/echo/abc", `{"id":"zzz","count":3,"tags":[],"big":"9007199254740993"}`), 200,
			`{"id":"abc","count":3,"big":"9007199254740993"}`)
		// path (percent-decoded, enum by number) + query of every kind
		q := "count=7&big=9007199254740993&ubig=18446744073709551615&flag=true&ratio=0.5&small=1.5" +
			"&tags=a&tags=b%20c&nums=1&nums=2&colors=COLOR_RED&colors=2&flags=true&flags=0" +
			"&nested.depth=3&nested.marks=1&nested.marks=-2&labels[k]=v&labels[x%20y]=z" +
			"&data=AQID&at=2024-01-02T03:04:05Z&maybe=0"
		r := n.req(t, "GET", "/api/v1/echo/a%2Fb%20c/lbl/1?"+q, "")
		expectJSON(t, "path + query", r, 200, `{"id":"a/b c","count":7,"big":"9007199254740993","ubig":"18446744073709551615",
			"flag":true,"ratio":0.5,"small":1.5,"color":"COLOR_RED","tags":["a","b c"],"nums":[1,2],
			"colors":["COLOR_RED","COLOR_GREEN"],"flags":[true,false],"nested":{"label":"lbl","depth":3,"marks":["1","-2"]},
			"labels":{"k":"v","x y":"z"},"data":"AQID","at":"2024-01-02T03:04:05Z","maybe":0}`)
		// an integer in another form proto3 JSON reads (docs/gateway.md)
		expectJSON(t, "query integer forms", n.req(t, "GET", "/api/v1/echo/p/l/COLOR_RED?count=1.0&nums=1e2", ""), 200,
			`{"id":"p","count":1,"nums":[100],"nested":{"label":"l"},"color":"COLOR_RED"}`)
		// a query parameter for a field the path sets is ignored
		expectJSON(t, "path wins over query", n.req(t, "GET", "/api/v1/echo/p/l/COLOR_RED?id=q", ""), 200,
			`{"id":"p","nested":{"label":"l"},"color":"COLOR_RED"}`)
	})

	t.Run("errors", func(t *testing.T) {
		expectError(t, "bad JSON", n.req(t, "POST", "/api/v1/echo", `{"count":`), 400, "invalid JSON")
		expectError(t, "bad JSON, merged", n.req(t, "PUT", "/api/v1/echo/a", `{"count":`), 400, "bad JSON body")
		// a body merged with path variables is refused where Go refuses it
		// unmerged (POST /v1/echo): each of these was a 200
		for _, c := range []struct{ name, method, path, body, want string }{
			{"merged: an empty list", "PUT", "/api/v1/echo/a", `[]`, "the body must be a JSON object"},
			{"merged: past a double", "PUT", "/api/v1/echo/a", `{"ratio":1e999}`, "ratio: out of range for double: 1e999"},
			{"merged: past a double, in a list", "PUT", "/api/v1/echo/a", `{"nested":{"marks":[-1e999]}}`, "out of range for int64: -1e999"},
			{"merged: a bad \\u escape", "PUT", "/api/v1/echo/a", `{"tags":["\u-001"]}`, "bad JSON body: bad \\u escape"},
			{"merged: the path's field a number", "PUT", "/api/v1/echo/a", `{"id":1}`, "path {id}: the body's id is not a string value"},
			{"merged: the path's field a lone surrogate", "PUT", "/api/v1/echo/a", `{"id":"\ud800"}`, "path {id}: the body's id is not a string value"},
			{"merged field: an empty list", "PATCH", "/api/v1/shelves/s/items/i", `[]`, "item: the body must be a JSON object"},
			{"merged field: the path's field a bool", "PATCH", "/api/v1/shelves/s/items/i", `{"name":true}`, "the body's name is not a string value"},
		} {
			expectError(t, c.name, n.req(t, c.method, c.path, c.body), 400, c.want)
			if c.method == "PUT" {
				expectError(t, c.name+", unmerged", n.req(t, "POST", "/api/v1/echo", c.body), 400)
			}
		}
		// a 64-bit integer given as a JSON number, merged: the double's
		// integer with every digit (it went out in 17 digits, another
		// integer: 2^60 as 1152921504606847000, 2^63-1 as ...800)
		for _, c := range []struct{ body, want string }{
			{`{"big":1152921504606846976}`, `{"id":"a","big":"1152921504606846976"}`},
			{`{"big":1000000000000000000}`, `{"id":"a","big":"1000000000000000000"}`},
			{`{"big":-9223372036854775808}`, `{"id":"a","big":"-9223372036854775808"}`},
		} {
			expectJSON(t, "merged "+c.body, n.req(t, "PUT", "/api/v1/echo/a", c.body), 200, c.want)
		}
		// 2^63-1 is 2^63 as a double: out of an int64's range
		expectError(t, "merged 2^63-1", n.req(t, "PUT", "/api/v1/echo/a", `{"big":9223372036854775807}`), 400,
			"big: out of range for int64: 9223372036854775808")
		// a name twice keeps its last value when merged (the decoders keep
		// no duplicates), where Go refuses it read whole
		expectJSON(t, "merged: a name twice", n.req(t, "PUT", "/api/v1/echo/a", `{"count":1,"count":2}`), 200, `{"id":"a","count":2}`)
		// a query parameter by both its names: the first's value is ours,
		// not a body's (it was a 500: the check had no label for it)
		// (which one is set last follows the query's table order: the
		// answer is the item, or a 400 for the invalid one)
		if r := n.req(t, "PATCH", "/api/v1/shelves/s/items/i?update_mask=title&updateMask=%ff", `{"title":"t"}`); r.status == 200 {
			expectJSON(t, "query by both names", r, 200, `{"name":"shelves/s/items/i","title":"t","tags":["title"]}`)
		} else {
			expectError(t, "query by both names", r, 400, "update_mask: invalid UTF-8 in string")
		}
		e := expectError(t, "unknown field", n.req(t, "POST", "/api/v1/echo", `{"nope":1}`), 400, "nope", "unknown field")
		if e != nil && e["code"] != float64(3) {
			t.Errorf("unknown field: code %v", e["code"])
		}
		expectError(t, "unknown field in a body field", n.req(t, "POST", "/api/v1/shelves/s/items", `{"nope":1}`), 400, "item.nope", "unknown field")
		expectError(t, "wrong type", n.req(t, "POST", "/api/v1/echo", `{"count":"abc"}`), 400, "count")
		expectError(t, "bad path value", n.req(t, "GET", "/api/v1/echo/abc:count", ""), 400, "count")
		expectError(t, "bad path enum", n.req(t, "GET", "/api/v1/echo/a/b/PURPLE", ""), 400, "color")
		expectError(t, "bad query bool", n.req(t, "GET", "/api/v1/echo/a/b/1?flag=maybe", ""), 400, "flag", "true or false")
		expectError(t, "unknown query parameter", n.req(t, "GET", "/api/v1/items/1?nope=1", ""), 400, "nope")
		expectError(t, "query parameter twice", n.req(t, "GET", "/api/v1/echo/a/b/1?count=1&count=2", ""), 400, "count", "2 times")
		expectError(t, "message in the query", n.req(t, "GET", "/api/v1/echo/a/b/1?nested=x", ""), 400, "nested.<field>")
		expectError(t, "no route", n.req(t, "GET", "/api/v2/items", ""), 404, "no route")
		expectError(t, "outside the prefix", n.req(t, "GET", "/api/", ""), 404)
		r := n.req(t, "DELETE", "/api/v1/echo", "")
		expectError(t, "wrong method", r, 405)
		if r.hdr.Get("Allow") != "POST" {
			t.Errorf("Allow: %q", r.hdr.Get("Allow"))
		}
		r = n.req(t, "POST", "/api/v1/items/1", `{}`)
		expectError(t, "wrong method", r, 405)
		if r.hdr.Get("Allow") != "DELETE, GET" {
			t.Errorf("Allow: %q", r.hdr.Get("Allow"))
		}
		expectError(t, "body over max_body", n.req(t, "POST", "/api/v1/echo", `{"id":"`+strings.Repeat("x", 2000)+`"}`), 413)
		expectError(t, "Content-Type", n.req(t, "POST", "/api/v1/echo", `{}`, "Content-Type", "text/plain"), 415, "application/json")
		expectError(t, "timeout", n.req(t, "GET", "/slowgw/v1/slow/60000", ""), 504, "timeout")
		expectError(t, "garbage answer", n.req(t, "GET", "/api/v1/garbage", ""), 502, "bad response")
		e = expectError(t, "mapped code", n.req(t, "GET", "/api/v1/fail/5?text=gone", ""), 404, "gone")
		if e != nil && e["code"] != float64(5) {
			t.Errorf("mapped code: %v", e["code"])
		}
		expectError(t, "unmapped code", n.req(t, "GET", "/api/v1/fail/7?text=no", ""), 500, "no")
		expectError(t, "binary error body", n.req(t, "GET", "/api/v1/fail/9?text=binary", ""), 500, "code 9")
		expectError(t, "grpc codes", n.req(t, "GET", "/full/v1/fail/7?text=denied", ""), 403, "denied")
		r = n.req(t, "GET", "/down/v1/items/1", "")
		expectError(t, "no server", r, 503, "connect")
		if r.hdr.Get("Retry-After") != "7" {
			t.Errorf("Retry-After: %q", r.hdr.Get("Retry-After"))
		}
		// accept protobuf
		r = n.req(t, "GET", "/api/v1/items/42", "", "Accept", "application/x-protobuf")
		item := dynamicpb.NewMessage(sd.Methods().ByName("GetItem").Output())
		if r.status != 200 || r.hdr.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal([]byte(r.body), item) != nil {
			t.Errorf("protobuf answer: %d %q", r.status, r.body)
		} else if id := item.Get(item.Descriptor().Fields().ByName("id")).String(); id != "42" {
			t.Errorf("protobuf answer: id %q", id)
		}
		expectError(t, "protobuf with response_body", n.req(t, "GET", "/api/v1/shelves/s/items", "", "Accept", "application/x-protobuf"), 406)
	})

	t.Run("options", func(t *testing.T) {
		// method_name = "full", discard_unknown, proto_names
		before := len(shop.seen())
		expectJSON(t, "full names", n.req(t, "GET", "/full/v1/items/3?nope=1", ""), 200,
			`{"name":"shelves//items/3","id":"3","price":"9007199254740993","color":"COLOR_RED","tags":["a","b"],"created":"2024-02-29T12:00:00Z"}`)
		expectJSON(t, "discard_unknown in the body", n.req(t, "POST", "/full/v1/echo", `{"nope":1,"count":2}`), 200, `{"count":2}`)
		expectJSON(t, "proto_names", n.req(t, "POST", "/full/v1/echo", `{"byNum":{"1":{"label":"x"}},"maybe":1}`), 200, `{"by_num":{"1":{"label":"x"}},"maybe":1}`)
		seen := shop.seen()[before:]
		if len(seen) != 3 || seen[0] != "gwtest.Shop/GetItem" || seen[1] != "gwtest.Shop/Echo" {
			t.Errorf("methods seen: %v", seen)
		}
		// merged, an unknown field of any value is dropped as Go drops it
		// read whole (1e999 goes out as such, not as a refused infinity)
		expectJSON(t, "discard_unknown, merged, past a double", n.req(t, "PUT", "/full/v1/echo/a", `{"zz":1e999,"count":3}`), 200, `{"id":"a","count":3}`)
		// the depth limit counts the message's levels: a body field's body
		// is one inside it (zz: an unknown field, dropped)
		deep := func(levels int) string {
			return `{"title":"t","zz":` + strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`
		}
		if r := n.req(t, "POST", "/full/v1/shelves/s1/items", deep(99)); r.status != 200 {
			t.Errorf("body field, 99 levels: %d %s", r.status, r.body)
		}
		expectError(t, "body field, 100 levels", n.req(t, "POST", "/full/v1/shelves/s1/items", deep(100)), 400,
			"nested too deep (more than 100 levels)")
		expectJSON(t, "discard_unknown, merged, a name twice", n.req(t, "PUT", "/full/v1/echo/a", `{"zz":{"q":1,"q":2},"count":3}`), 200, `{"id":"a","count":3}`)
		// forward_headers in, response_headers out
		r := n.req(t, "POST", "/api/v1/echo", `{}`, "X-Request-Id", "r1", "X-Fwd-A", "1", "X-Other", "2")
		if r.status != 200 || r.hdr.Get("X-Echo-X-Request-Id") != "r1" || r.hdr.Get("X-Echo-X-Fwd-A") != "1" || r.hdr.Get("X-Echo-X-Other") != "" {
			t.Errorf("headers: %d %v", r.status, r.hdr)
		}
		// bad configurations
		st, body := n.get("/badconf")
		want := []string{
			"bad argument #1: options must be a table (got string)",
			"bad argument #1: unknown option 'tiemout'",
			"bad argument #1: upstream must be host:port or a list of them (got number)",
			"bad argument #1: opts: ca must not be empty",
			"bad argument #1: opts: conns must be",
			`bad argument #1: upstream: duplicate address`,
			// in gateway.new's terms: upstream, not connect's addrs
			`bad argument #1: upstream[2] must be host:port (got "bad")`,
			`bad argument #1: upstream must be host:port (got "bad")`,
			`bad argument #1: upstream[2] must be host:port with a port 1..65535 (got "bad:0")`,
			"bad argument #1: opts: methods.Nope.try_timeout must be",
			"bad argument #1: protos must be a table { files = { ... }, import_paths = { ... } }",
			`bad argument #1: method_name must be "short" or "full" (got long)`,
			`bad argument #1: prefix must be "" or a path like "/api" (no trailing /)`,
			"bad argument #1: codes[5] must be an HTTP status 200..599",
			"bad argument #1: max_body must be an integer 0..2147483647 (bytes)",
			`bad argument #1: routes: key /v1/x must be "VERB /path/{field}"`,
			`bad argument #1: routes["GET /v1/{x"]: path bad variable "{x"`,
			`skipped GET /v1/x of gwtest.Shop.Nope (routes): no method gwtest.Shop.Nope in shop.proto`,
			`skipped GET /v1/{nope} of gwtest.Shop.Internal (routes): {nope}: no field nope in gwtest.FileRequest`,
			`bad argument #1: forward_headers[1]: a pattern is a name or a prefix followed by one * (got "a*b")`,
			`bad argument #1: routes["GET /v1/**/x"]: path ** must be the last segment`,
			`bad argument #1: routes["GET /v1/{a}/{a}"]: path variable a twice`,
			`bad argument #1: routes["GET /v1/{a=}"]: path bad variable "{a=}"`,
			`bad argument #1: routes["GET /v1/x:"]: path bad verb ""`,
			`bad argument #1: routes["GET /v1/x"]: unknown option 'bdy'`,
			`skipped POST /v1/x of gwtest.Shop.Echo (routes): body: no field nope in gwtest.Kinds`,
			"bad proto: ",
			"ok",
		}
		got := strings.Split(strings.TrimSpace(body), "\n")
		if st != 200 || len(got) != len(want) {
			t.Fatalf("badconf: %d\n%s", st, body)
		}
		for i := range want {
			if !strings.Contains(got[i], want[i]) {
				t.Errorf("badconf %d: %q does not contain %q", i, got[i], want[i])
			}
		}
	})

	t.Run("openapi", func(t *testing.T) {
		r := n.req(t, "GET", "/api/openapi.json", "")
		if r.status != 200 || r.hdr.Get("Content-Type") != "application/json" {
			t.Fatalf("openapi.json: %d %s", r.status, r.body)
		}
		validateOpenAPI(t, []byte(r.body))
		var doc struct {
			OpenAPI string `json:"openapi"`
			Info    struct{ Title, Version, Description string }
			Paths   map[string]map[string]struct {
				OperationID string `json:"operationId"`
				Description string
				Parameters  []struct {
					Name, In string
				}
				RequestBody *struct{} `json:"requestBody"`
			}
			Components struct {
				Schemas map[string]struct {
					Description string
					Properties  map[string]struct {
						Description string
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(r.body), &doc); err != nil {
			t.Fatal(err)
		}
		if doc.OpenAPI != "3.1.0" || doc.Info.Title != "Shop" || doc.Info.Version != "2.0" || doc.Info.Description != "Shop sells items from shelves." {
			t.Errorf("openapi header: %+v %+v", doc.OpenAPI, doc.Info)
		}
		var paths []string
		for p, ops := range doc.Paths {
			for m := range ops {
				paths = append(paths, m+" "+p)
			}
		}
		sort.Strings(paths)
		for _, want := range []string{
			"get /api/v1/items/{id}", "get /api/v1/{parent}/items", "patch /api/v1/{item.name}",
			"get /api/v1/files/{path}", "get /api/v1/wild/{_1}/{path}", "post /api/v1/jobs/{path}:cancel",
			"get /api/v1/echo/{count}:count", "get /api/v1/echo/{id}/{nested.label}/{color}", "post /api/v1/internal",
		} {
			if i := sort.SearchStrings(paths, want); i >= len(paths) || paths[i] != want {
				t.Errorf("openapi: no %s in %v", want, paths)
			}
		}
		list := doc.Paths["/api/v1/{parent}/items"]["get"]
		var params []string
		for _, p := range list.Parameters {
			params = append(params, p.In+":"+p.Name)
		}
		if strings.Join(params, " ") != "path:parent query:page_size query:colors" || list.Description != "ListItems lists the items of a shelf." {
			t.Errorf("ListItems: %v %q", params, list.Description)
		}
		if doc.Paths["/api/v1/echo"]["post"].RequestBody == nil {
			t.Errorf("Echo: no request body")
		}
		if d := doc.Components.Schemas["gwtest.Item"].Properties["name"].Description; d != "Resource name: shelves/{shelf}/items/{id}." {
			t.Errorf("field comment: %q", d)
		}
		if _, ok := doc.Components.Schemas["qrpc.gateway.Error"]; !ok {
			t.Errorf("no error schema")
		}
		redoclyLint(t, []byte(r.body))
		// not served where openapi is off
		expectError(t, "no openapi.json", n.req(t, "GET", "/full/openapi.json", ""), 404)
	})

	t.Run("connection lost", func(t *testing.T) {
		done := make(chan gwResp, 1)
		go func() { done <- n.req(t, "GET", "/lost/v1/slow/30000", "") }()
		// once the call is in flight at the server, it goes away
		testwait.For(10*time.Second, func() bool { return len(lost.seen()) > 0 })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		_ = lost.srv.Shutdown(ctx)
		cancel()
		expectError(t, "connection lost", <-done, 502, "connection lost")
	})

	t.Run("pool with a server killed", func(t *testing.T) {
		for i := 0; i < 10; i++ {
			expectJSON(t, "pool", n.req(t, "GET", "/pool/v1/files/x", ""), 200, `{"path":"x"}`)
		}
		if len(poolA.seen()) == 0 || len(poolB.seen()) == 0 {
			t.Errorf("calls not spread: %d %d", len(poolA.seen()), len(poolB.seen()))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		_ = poolA.srv.Shutdown(ctx)
		cancel()
		before := len(poolB.seen())
		for i := 0; i < 20; i++ {
			expectJSON(t, "pool, one down", n.req(t, "GET", "/pool/v1/files/y", ""), 200, `{"path":"y"}`)
		}
		if got := len(poolB.seen()) - before; got < 20 {
			t.Errorf("the live server answered %d of 20", got)
		}
	})
}

// validateOpenAPI checks the document against the OpenAPI 3.1 schema with
// pb33f's libopenapi and libopenapi-validator.
func validateOpenAPI(t *testing.T, b []byte) {
	t.Helper()
	doc, err := libopenapi.NewDocument(b)
	if err != nil {
		t.Fatalf("openapi: %v", err)
	}
	if v := doc.GetVersion(); v != "3.1.0" {
		t.Errorf("openapi version %q", v)
	}
	if _, err := doc.BuildV3Model(); err != nil {
		t.Errorf("openapi model: %v", err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("openapi validator: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("openapi: %s: %s", e.Message, e.Reason)
			for _, se := range e.SchemaValidationErrors {
				t.Errorf("  %s at %s: %s", se.Reason, se.KeywordLocation, se.FieldPath)
			}
		}
	}
}

// redoclyLint runs `npx @redocly/cli lint` on the document when npx is
// there and the npm registry answers; it logs why not otherwise.
func redoclyLint(t *testing.T, b []byte) {
	t.Helper()
	npx, err := exec.LookPath("npx")
	if err != nil {
		t.Log("redocly lint skipped: no npx")
		return
	}
	dir := t.TempDir()
	f := filepath.Join(dir, "openapi.json")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// The recommended rules, but for those about what a gateway cannot
	// know: the API's security schemes and license.
	cfg := "extends:\n  - recommended\nrules:\n  security-defined: off\n  info-license: off\n"
	if err := os.WriteFile(filepath.Join(dir, "redocly.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, npx, "--yes", "@redocly/cli@2.77.0", "lint", "--format", "stylish", f)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Logf("redocly lint: ok\n%s", out)
		return
	}
	s := string(out)
	if ctx.Err() != nil || strings.Contains(s, "ENOTFOUND") || strings.Contains(s, "EAI_AGAIN") ||
		strings.Contains(s, "ECONNREFUSED") || strings.Contains(s, "ETIMEDOUT") || strings.Contains(s, "npm ERR!") ||
		strings.Contains(s, "npm error") {
		t.Logf("redocly lint skipped: the npm registry did not answer (%v): %s", err, tail(s, 3))
		return
	}
	t.Errorf("redocly lint: %v\n%s", err, s)
}

// TestGatewayMetrics: qrpc.metrics() counts the gateway's requests by
// route template (never the raw path), method and status, with their
// durations, beside the pool's own series.
func TestGatewayMetrics(t *testing.T) {
	t.Parallel()
	dir := gatewayDir(t)
	sd := compileShop(t, dir)
	shop := startShopServer(t, sd, "127.0.0.1:0")
	n := startNginx(t, ngxConf{
		Workers:   1,
		InitByLua: gatewayInit(dir),
		Extra: map[string]string{
			"shop_addr": shop.addr, "down_addr": shop.addr, "lost_addr": shop.addr,
			// a pool of two servers: gateway.new refuses a duplicate address
			"pool_a": shop.addr, "pool_b": fmt.Sprintf("127.0.0.1:%d", ngxtest.FreePort(t)), "proto_dir": dir, "call_timeout": "10000",
		},
		Server: `
        location /api/ { content_by_lua_block { package.loaded.gw_main:serve() } }
        location = /metrics { content_by_lua_block { ngx.print((require "resty.ffi.qrpc").metrics()) } }`,
		AllowErrors: []string{`qrpc gateway: routes\["GET /v1/x"\]: no method gwtest.Shop.Nope`, `bad proto: .*absent.proto`},
	})
	const calls = 7
	for i := range calls {
		if r := n.req(t, "GET", fmt.Sprintf("/api/v1/items/%d", 40+i), ""); r.status != 200 {
			t.Fatalf("GET item: %d %s", r.status, r.body)
		}
	}
	if r := n.req(t, "GET", "/api/no/such/route", ""); r.status != 404 {
		t.Fatalf("no route: %d %s", r.status, r.body)
	}
	st, text := n.get("/metrics")
	if st != 200 {
		t.Fatalf("/metrics: %d %s", st, text)
	}
	for _, want := range []string{
		`qrpc_gateway_requests_total{route="GET /api/v1/items/{id}",method="GET",status="200"} 7`,
		`qrpc_gateway_requests_total{route="none",method="GET",status="404"} 1`,
		`qrpc_gateway_request_duration_seconds_count{route="GET /api/v1/items/{id}"} 7`,
		`qrpc_gateway_request_duration_seconds_bucket{route="GET /api/v1/items/{id}",le="+Inf"} 7`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("missing %s", want)
		}
	}
	if strings.Contains(text, "/v1/items/4") || strings.Contains(text, "/no/such") {
		t.Error("a raw path in the metrics")
	}
	if t.Failed() {
		t.Log(text)
	}
}

// TestGatewayAttempts: $qrpc_attempts, declared, shows each call's
// attempts in the access log and to a header filter. The pool's first
// server holds GetItem until the attempt is given up (try_timeout), so a
// request whose first attempt went there is answered by the shop on its
// retry: 2, as many as the attempts the held server got in the metrics;
// the others 1. A request that matches no route makes no call: nothing.
func TestGatewayAttempts(t *testing.T) {
	t.Parallel()
	dir := gatewayDir(t)
	sd := compileShop(t, dir)
	shop := startShopServer(t, sd, "127.0.0.1:0")
	held := qrpc.NewServer(&qrpc.ServerConfig{})
	held.Handle("GetItem", func(ctx context.Context, _ *qrpc.Request, _ *qrpc.Response) { <-ctx.Done() })
	a, err := held.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Close() })
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        package.loaded.gw = assert(gateway.new{`,
			`            upstream = { qt.held_addr, qt.shop_addr }, prefix = "/a",`,
			`            protos = { files = { "shop.proto" }, import_paths = { qt.proto_dir } },`,
			`            opts = qt.opts({ timeout = 10000, try_timeout = 1000, retries = 1,`,
			`                             health = { stall = 0, failures = 1000 } }),`,
			`        })`,
		),
		Extra: map[string]string{"held_addr": a.String(), "shop_addr": shop.addr, "proto_dir": dir},
		HTTP:  `    log_format attempts '$uri $status a=$qrpc_attempts';`,
		Server: `
        location /a/ {
            set $qrpc_attempts "";
            access_log attempts.log attempts;
            content_by_lua_block { package.loaded.gw:serve() }
            header_filter_by_lua_block { ngx.header["X-Attempts"] = ngx.var.qrpc_attempts }
        }
        location = /metrics { content_by_lua_block { ngx.print((require "resty.ffi.qrpc").metrics()) } }`,
	})
	const calls = 4
	retried := 0
	var want []string
	for i := range calls {
		path := fmt.Sprintf("/a/v1/items/%d", i)
		r := n.req(t, "GET", path, "")
		att := r.hdr.Get("X-Attempts")
		if r.status != 200 || (att != "1" && att != "2") {
			t.Fatalf("%s: %d, X-Attempts %q: want 200 after 1 or 2 attempts (%s)", path, r.status, att, r.body)
		}
		if att == "2" {
			retried++
		}
		want = append(want, path+" 200 a="+att)
	}
	if r := n.req(t, "GET", "/a/no/route", ""); r.status != 404 || r.hdr.Get("X-Attempts") != "" {
		t.Errorf("no route: %d, X-Attempts %q: want 404 and none", r.status, r.hdr.Get("X-Attempts"))
	}
	want = append(want, "/a/no/route 404 a=")
	m, _ := scrape(t, n)
	if atHeld := metricSum(m, "qrpc_client_calls_total", `server="`+a.String()+`"`); retried == 0 || float64(retried) != atHeld {
		t.Errorf("%d requests made 2 attempts, %v attempts went to the held server: want as many, and some", retried, atHeld)
	}
	// The log phase may end after the answer is out: a bounded wait for
	// the lines.
	var got string
	testwait.For(10*time.Second, func() bool {
		got = n.readFile("attempts.log")
		return strings.Count(got, "\n") >= len(want)
	})
	if got != strings.Join(want, "\n")+"\n" {
		t.Errorf("access log:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}
