package nginx

import "testing"

// gateway.md, grpc-gateway clients: a response_body field the answer
// leaves unset. grpc-gateway v2 marshals the field's value, a nil message,
// with its marshaler's options: protojson writes the message's zero form
// (with EmitUnpopulated, its default, every field at its zero value; {}
// without), a well-known type's zero JSON ("0s", "", [], ...). Under
// compat the gateway answered null (the field's value in the answer's
// JSON text, where EmitUnpopulated writes an unset message as null).
func TestGatewayCompatUnsetResponseBody(t *testing.T) {
	dir := compatDir(t)
	addr, _ := compatServer(t)
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        local protos = { files = { "compat.proto" }, import_paths = { qt.proto_dir } }`,
			`        local routes = {}`,
			`        for _, f in ipairs({ "nested", "struct_field", "extra", "tags" }) do`,
			`            routes["POST /v1/rb/" .. f] = { method = "gwcompat.Compat.Echo", body = "*", response_body = f }`,
			`        end`,
			`        for _, f in ipairs({ "thing", "update_mask" }) do`,
			`            routes["POST /v1/rb/" .. f] = { method = "gwcompat.Compat.Update", body = "*", response_body = f }`,
			`        end`,
			`        local function gw(prefix, o)`,
			`            o.upstream, o.prefix, o.protos, o.routes = qt.compat_addr, prefix, protos, routes`,
			`            o.opts = qt.opts({ timeout = 10000 })`,
			`            package.loaded["gw" .. prefix] = assert(gateway.new(o))`,
			`        end`,
			`        gw("/c", { compat = "grpc-gateway" })`,
			`        gw("/n", { compat = "grpc-gateway", proto_names = true })`,
			`        gw("/e", { compat = "grpc-gateway", emit_unpopulated = false })`,
			`        gw("/d", {})`,
		),
		Extra: map[string]string{"compat_addr": addr, "proto_dir": dir},
		Server: `
        location /c/ { content_by_lua_block { package.loaded["gw/c"]:serve() } }
        location /n/ { content_by_lua_block { package.loaded["gw/n"]:serve() } }
        location /e/ { content_by_lua_block { package.loaded["gw/e"]:serve() } }
        location /d/ { content_by_lua_block { package.loaded["gw/d"]:serve() } }`,
	})
	post := func(path, body string) gwResp {
		return n.rawReq(t, "POST", path, body, "Content-Type", "application/json")
	}
	for _, c := range []struct{ what, path, body, want string }{
		{"compat: an unset message", "/c/v1/rb/nested", `{"uuid":"u"}`, `{"name":"","amount":0}`},
		{"compat: a set message", "/c/v1/rb/nested", `{"nested":{"name":"n"}}`, `{"name":"n","amount":0}`},
		{"compat: an unset message with message fields", "/c/v1/rb/thing", `{}`,
			`{"uuid":"","int32Value":0,"nested":null,"structField":null,"valueField":null,"tags":[],"note":"","extra":null}`},
		{"compat, proto_names", "/n/v1/rb/thing", `{}`,
			`{"uuid":"","int32_value":0,"nested":null,"struct_field":null,"value_field":null,"tags":[],"note":"","extra":null}`},
		{"compat: an unset Struct", "/c/v1/rb/struct_field", `{"uuid":"u"}`, `{}`},
		{"compat: an unset Any", "/c/v1/rb/extra", `{"uuid":"u"}`, `{}`},
		{"compat: an unset repeated", "/c/v1/rb/tags", `{"uuid":"u"}`, `[]`},
		{"compat: an unset FieldMask", "/c/v1/rb/update_mask", `{}`, `""`},
		{"compat, emit_unpopulated = false", "/e/v1/rb/nested", `{"uuid":"u"}`, `{}`},
		{"default mode: unchanged", "/d/v1/rb/nested", `{"uuid":"u"}`, `{}`},
		{"default mode: an unset FieldMask, unchanged", "/d/v1/rb/update_mask", `{}`, `null`},
		{"default mode: a set message", "/d/v1/rb/nested", `{"nested":{"name":"n"}}`, `{"name":"n"}`},
	} {
		expectJSON(t, c.what, post(c.path, c.body), 200, c.want)
	}
}
