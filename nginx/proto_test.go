package nginx

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// pbServer is a qrpc server whose handlers use the code protoc-gen-go
// generated from demo/proto/greeter.proto: what Lua encodes is read by an
// implementation that shares nothing with ours, and the other way round.
type pbServer struct {
	addr     string
	requests atomic.Int64 // requests and events that reached a handler
	lastName atomic.Value // the last HelloRequest.name seen by an event
}

func startPBServer(t *testing.T) *pbServer {
	t.Helper()
	s := &pbServer{}
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	srv.Handle("SayHello", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.requests.Add(1)
		var in demopb.HelloRequest
		if err := proto.Unmarshal(req.Body, &in); err != nil {
			resp.Code, resp.Body = 3, []byte("not a HelloRequest: "+err.Error())
			return
		}
		resp.Body, _ = proto.Marshal(&demopb.HelloReply{Message: "Hello " + in.Name + "!"})
	})
	srv.Handle("EchoAllKinds", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.requests.Add(1)
		var m demopb.AllKinds
		if err := proto.Unmarshal(req.Body, &m); err != nil {
			resp.Code, resp.Body = 3, []byte("not an AllKinds: "+err.Error())
			return
		}
		resp.Body, _ = proto.MarshalOptions{Deterministic: true}.Marshal(&m)
	})
	// Deep answers an AllKinds of name's number of levels (an Inner
	// chain): deeper than the request that asks for it.
	srv.Handle("Deep", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.requests.Add(1)
		var in demopb.HelloRequest
		levels, err := 0, proto.Unmarshal(req.Body, &in)
		if err == nil {
			levels, err = strconv.Atoi(in.Name)
		}
		if err != nil || levels < 2 {
			resp.Code, resp.Body = 3, []byte("want a HelloRequest with a number of levels")
			return
		}
		inner := &demopb.AllKinds_Inner{Id: "x"}
		for i := 2; i < levels; i++ {
			inner = &demopb.AllKinds_Inner{Child: inner}
		}
		resp.Body, _ = proto.Marshal(&demopb.AllKinds{Inner: inner})
	})
	srv.Handle("Garbage", func(_ context.Context, _ *qrpc.Request, resp *qrpc.Response) {
		s.requests.Add(1)
		resp.Body = []byte("\xff\x00 not protobuf")
	})
	srv.HandleEvent("Hello", func(_ context.Context, req *qrpc.Request) {
		s.requests.Add(1)
		var in demopb.HelloRequest
		if proto.Unmarshal(req.Body, &in) == nil {
			s.lastName.Store(in.Name)
		}
	})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	s.addr = a.String()
	return s
}

// protoDir copies the demo schema where nginx's workers (nobody, when the
// suite runs as root) can read it, with a broken file next to it.
func protoDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qproto-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"greeter.proto", "greeter.protoset"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, "demo", "proto", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	broken := "syntax = \"proto3\";\npackage broken;\nmessage M {\n  int32 x = 1\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "broken.proto"), []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The Lua side of every case: tables and JSON through a real nginx, the
// library and a qrpc server with generated code.
const protoLua = `
local qrpc = require "resty.ffi.qrpc"
local qt = require "qtest"
local json = require "resty.ffi.qrpc.json"

local _M = {}

local methods = {
    SayHello = { request = "demo.HelloRequest", response = "demo.HelloReply" },
    EchoAllKinds = { request = "demo.AllKinds", response = "demo.AllKinds" },
}

function _M.conn()
    return qt.connect({ methods = methods }, qt.pb_addr)
end

-- deep comparison; returns nil or the path of the first difference
local function diff(a, b, path)
    if type(a) ~= type(b) then
        return path .. ": " .. type(a) .. " vs " .. type(b)
    end
    if type(a) ~= "table" then
        if a ~= b and not (a ~= a and b ~= b) then
            return path .. ": " .. tostring(a) .. " vs " .. tostring(b)
        end
        return nil
    end
    for k, v in pairs(a) do
        local d = diff(v, b[k], path .. "." .. tostring(k))
        if d then return d end
    end
    for k in pairs(b) do
        if a[k] == nil then
            return path .. "." .. tostring(k) .. ": missing on the left"
        end
    end
    return nil
end
_M.diff = diff

return _M
`

func TestProtobuf(t *testing.T) {
	t.Parallel()
	srv := startPBServer(t)
	dir := protoDir(t)
	init := lines(
		`        local qrpc = require "resty.ffi.qrpc"`,
		`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
		// Recorded in the master, compiled by each worker on first use.
		`        assert(qrpc.proto.load("`+dir+`/greeter.proto"))`,
		// A broken file is only found out in the worker; a missing one here.
		`        assert(qrpc.proto.load("`+dir+`/broken.proto"))`,
		`        local ok, err = qrpc.proto.load("`+dir+`/absent.proto")`,
		`        package.loaded.init_missing = err`,
	)
	n := startNginx(t, ngxConf{
		Workers:     1,
		InitByLua:   init,
		Extra:       map[string]string{"pb_addr": srv.addr, "proto_dir": dir},
		AllowErrors: []string{`bad proto: .*broken\.proto:5:1: syntax error: expecting ';' \(loaded in init_by_lua\)`},
		Server: loc("/roundtrip", `
                local p = require "pbt"
                local conn, err = p.conn()
                if not conn then return ngx.say("connect: ", err) end
                local big = "9223372036854775807"
                local msg = {
                    i32 = -2147483648, i64 = "-9223372036854775808", u32 = 4294967295,
                    u64 = "18446744073709551615", s32 = -1, s64 = big, f32 = 4294967295,
                    f64 = "18446744073709551615", sf32 = 2147483647, sf64 = "-9",
                    fl = 1.5, db = 0.1 + 0.2, flag = true, text = "héllo \"q\"\n\0",
                    data = ngx.encode_base64("\0\1\2\255"), color = "COLOR_BLUE",
                    inner = { id = "i", values = { 1, -2, 3 }, child = { id = "c" } },
                    tags = { "a", "b" }, items = { { id = "x" }, { values = { 5 } } },
                    big = { big, "-1" }, colors = { "COLOR_RED", "COLOR_GREEN" },
                    ratios = { 0.5, -1e300 },
                    counts = { a = "1", z = "-5" }, byId = { ["7"] = { id = "seven" }, ["-1"] = { id = "m" } },
                    labels = { k = "v" }, blobs = { ["true"] = "AQ==" },
                    choiceInner = { id = "chosen" },
                    at = "2024-02-29T23:59:59.123456789Z", took = "-1.500s",
                    meta = { n = 1.25, s = "x", l = { true, false }, o = { k = "v" } },
                    value = "v", wrapped = "-5", maybe = 0,
                }
                local res, err = conn:unary("EchoAllKinds", msg, { proto_names = false })
                if not res then return ngx.say("unary: ", err) end
                local d = p.diff(msg, res.body, "body")
                if d then return ngx.say("differs: ", d) end
                -- special floats, and an int64 as a Lua number in
                res, err = conn:unary("EchoAllKinds", { fl = "NaN", db = "-Infinity", ratios = { "Infinity" }, i64 = 12345 })
                if not res then return ngx.say("unary 2: ", err) end
                local b = res.body
                if b.fl ~= "NaN" or b.db ~= "-Infinity" or b.ratios[1] ~= "Infinity" or b.i64 ~= "12345" then
                    return ngx.say("special: ", require("resty.ffi.qrpc.json").encode(b))
                end
                -- .proto field names by default for tables
                res = assert(conn:unary("EchoAllKinds", { byId = { ["1"] = {} }, choiceText = "t" }))
                if not res.body.by_id or res.body.choice_text ~= "t" then
                    return ngx.say("names: ", require("resty.ffi.qrpc.json").encode(res.body))
                end
                ngx.say("ok")
`) + loc("/json", `
                local p = require "pbt"
                local conn = assert(p.conn())
                local body = '{"i64":"-9223372036854775808","u64":"18446744073709551615","fl":"NaN",'
                    .. '"data":"AAEC/w==","color":"COLOR_BLUE","byId":{"-1":{"id":"m"},"7":{}},'
                    .. '"choiceNum":"0","at":"2024-02-29T23:59:59.500Z","took":"1s","meta":{"a":[1,null]}}'
                local res, err = conn:unary("EchoAllKinds", body, { json = true })
                if not res then return ngx.say("unary: ", err) end
                ngx.say(res.body == body and "ok" or ("differs: " .. res.body))
`) + loc("/hello", `
                local p = require "pbt"
                local conn = assert(p.conn())
                -- per-call types, without the connection's defaults
                local qt = require "qtest"
                local plain = assert(require("resty.ffi.qrpc").connect(qt.pb_addr, qt.opts()))
                local res, err = plain:unary("SayHello", { name = "per call" },
                    { request = "demo.HelloRequest", response = "demo.HelloReply" })
                if not res then return ngx.say("per call: ", err) end
                ngx.say(res.body.message)
                res = assert(conn:unary("SayHello", '{"name":"json"}', { json = true }))
                ngx.say(res.body)
                -- JSON on one side: a table in and JSON text out, and back
                res = assert(conn:unary("SayHello", { name = "table" }, { json = "response" }))
                ngx.say(res.body)
                res = assert(conn:unary("SayHello", '{"name":"text"}', { json = "request" }))
                ngx.say(res.body.message)
                res = assert(conn:unary("SayHello", { name = "x", extra = 1 }, { discard_unknown = true }))
                ngx.say(res.body.message)
                -- types only name bytes: a HelloReply read as a HelloRequest
                -- (same field 1) is a HelloRequest
                res = assert(conn:unary("SayHello", {}, { response = "demo.HelloRequest" }))
                ngx.say(require("resty.ffi.qrpc.json").encode(res.body))
                -- events: encoded the same way
                assert(conn:event("Hello", { name = "by event" }, { request = "demo.HelloRequest" }))
                ngx.say("event sent")
`) + loc("/bad", `
                local p = require "pbt"
                local qrpc = require "resty.ffi.qrpc"
                local conn = assert(p.conn())
                local function show(res, err, info)
                    if res then return ngx.say("answered") end
                    local raw = info and info.res
                    ngx.say(err, raw and (" | raw: " .. ngx.encode_base64(raw.body)) or "")
                end
                show(conn:unary("SayHello", { nmae = "typo" }))
                show(conn:unary("SayHello", { name = 5 }))
                show(conn:unary("EchoAllKinds", { i32 = 2147483648 }))
                show(conn:unary("EchoAllKinds", { i32 = 1.5 }))
                show(conn:unary("EchoAllKinds", { items = { { id = "ok" }, { id = {} } } }))
                show(conn:unary("EchoAllKinds", { color = "PURPLE" }))
                show(conn:unary("EchoAllKinds", { tags = {} }))
                show(conn:unary("SayHello", '{"name":', { json = true }))
                show(conn:unary("SayHello", {}, { request = "demo.Nope" }))
                show(conn:unary("SayHello", "raw", {}))
                show(conn:unary("SayHello", { name = "x" }, { json = "request" }))
                show(conn:unary("SayHello", { name = "x" }, { json = "yes" }))
                show(conn:unary("SayHello", { name = function() end }))
                local cyc = {}
                cyc.next = cyc
                show(conn:unary("EchoAllKinds", { meta = cyc }))
                -- 101 tables with the body: one more than string.buffer encodes
                local deep, d = {}, nil
                d = deep
                for _ = 1, 99 do d.a = {} d = d.a end
                show(conn:unary("EchoAllKinds", { meta = deep }))
                show(conn:unary("SayHello", { name = coroutine.create(function() end) }))
                show(conn:unary("SayHello", { name = io.stdout }))
                show(conn:event("Hello", { nope = 1 }, { request = "demo.HelloRequest" }))
                show(conn:unary("Garbage", "", { response = "demo.HelloReply" }))
                show(conn:unary("SayHello", {}, { request = 5 }))
                show(conn:unary("SayHello", {}, setmetatable({}, { __index = function(_, k) error("boom " .. k) end })))
                show(qrpc.connect(require("qtest").pb_addr, require("qtest").opts({
                    methods = { SayHello = setmetatable({}, { __index = function() error("bang") end }) } })))
                show(qrpc.proto.load(require("qtest").proto_dir .. "/broken.proto"))
                show(qrpc.proto.load(require("qtest").proto_dir .. "/nothere.proto"))
                show(qrpc.proto.load_descriptor_set("\255\255"))
                show(qrpc.proto.load(""))
                ngx.say("init: ", package.loaded.init_missing)
`) + loc("/jsonlib", `
                local json = require "resty.ffi.qrpc.json"
                local out = {}
                local function enc(v, want)
                    local got, err = json.encode(v)
                    if got ~= want then out[#out + 1] = "encode: " .. tostring(got) .. " " .. tostring(err) .. " want " .. want end
                end
                enc(0.1, "0.1")
                enc(0.1 + 0.2, "0.30000000000000004")
                enc(2^53, "9007199254740992")
                enc(-2147483648, "-2147483648")
                enc(1e300, "1e+300")
                enc(0/0, '"NaN"')
                enc(-math.huge, '"-Infinity"')
                enc({}, "{}")
                enc(json.empty_array, "[]")
                enc({ 1, "a", true }, '[1,"a",true]')
                enc({ [2] = "x" }, '{"2":"x"}')    -- not 1..n: an object
                enc({ a = ngx.null }, '{"a":null}')
                enc("q\"\\\n\0\127é", '"q\\"\\\\\\n\\u0000\\u007fé"')
                enc("ab\0c", '"ab\\u0000c"')      -- escaping found past a NUL byte
                -- object keys: escaped, and the same through the cache of key texts
                for _ = 1, 2 do
                    enc({ ['k"\n'] = 1 }, '{"k\\"\\n":1}')
                    enc({ [string.rep("x", 100) .. "\t"] = true }, '{"' .. string.rep("x", 100) .. '\\t":true}')
                end
                -- more distinct keys than the cache holds: it starts over, output unchanged
                for i = 1, 5000 do
                    local k = "key" .. i .. (i % 7 == 0 and "\"" or "")
                    local want = '{"key' .. i .. (i % 7 == 0 and '\\"' or "") .. '":' .. i .. "}"
                    local got = json.encode({ [k] = i })
                    if got ~= want then out[#out + 1] = "key " .. i .. ": " .. tostring(got) break end
                end
                local cyc = {}
                cyc.self = cyc
                local _, err = json.encode(cyc)
                if not err or not err:find("nested too deep", 1, true) then out[#out + 1] = "cycle: " .. tostring(err) end
                -- the pure-Lua decoder agrees with the text protojson writes
                local samples = {
                    '{"i64":"-9223372036854775808","fl":"NaN","db":0.30000000000000004,"tags":["a",""],"o":{}}',
                    '{"s":"\\u00e9\\ud83d\\ude00\\n\\"\\/","n":-1.5e-7,"l":[1,[2,[]],null,true,false]}',
                    ' [ ] ', '"x"', '12', 'null',
                }
                for _, s in ipairs(samples) do
                    local v, err = json.decode_lua(s)
                    if v == nil then
                        out[#out + 1] = "decode_lua " .. s .. ": " .. tostring(err)
                    else
                        local again = json.encode(v)
                        local w = json.decode_lua(again)
                        local d = require("pbt").diff(v, w, "v")
                        if d then out[#out + 1] = "re-decode " .. s .. ": " .. d end
                        if json.has_cjson then
                            local c = require("cjson.safe").decode(s)
                            d = require("pbt").diff(v, c, "v")
                            if d and type(c) == "table" and next(c) ~= nil then
                                out[#out + 1] = "vs cjson " .. s .. ": " .. d
                            end
                        end
                    end
                end
                local v = json.decode_lua('{"s":"\\u00e9\\ud83d\\ude00"}')
                if v.s ~= "é😀" then out[#out + 1] = "unicode: " .. v.s end
                for _, bad in ipairs({ '{"a":}', '[1,', '{"a" 1}', '"\\x"', '{} x', '' }) do
                    if json.decode_lua(bad) ~= nil then out[#out + 1] = "accepted " .. bad end
                end
                ngx.say(#out == 0 and "ok" or table.concat(out, "\n"))
`) + loc("/luatables", `
                -- replies for tables come in LuaJIT's serialization format
                -- (QRPC_F_LUA_TABLE); they must read as the JSON reads
                -- (cjson, or the module's decoder where there is no cjson)
                local p = require "pbt"
                local proto = require "resty.ffi.qrpc.proto"
                local json = require "resty.ffi.qrpc.json"
                local sbuf = require "string.buffer"
                local conn = assert(p.conn())
                local view = require("resty.ffi.qrpc.testing").view(conn)
                local out = {}
                -- QRPC_F_LUA_TABLE (4) and QRPC_F_LUA_REQUEST (8) for tables,
                -- the latter for a nil body too
                for _, b in ipairs({ {}, false }) do
                    local _, _, _, flags = proto.prepare(view, "EchoAllKinds", b or nil)
                    if flags % 16 < 12 then out[#out + 1] = "flags " .. flags end
                end
                _, _, _, flags = proto.prepare(view, "EchoAllKinds", "{}", { json = true })
                if flags >= proto.F_LUA_TABLE then out[#out + 1] = "json = true asked for Lua tables" end
                local msg = {
                    text = "é😀\n\"\\\0\1/", tags = { "", string.rep("x", 300) }, ratios = { 0.1, -0, 1e-300 },
                    meta = { s = "\t", l = { 1, { 2, {} }, ngx.null, true, false, {} }, o = { [""] = { k = "v" } } },
                    counts = { a = "1" }, u32 = 4294967295, fl = "-Infinity", i64 = "-9223372036854775808",
                }
                local tres, err = conn:unary("EchoAllKinds", msg)
                if not tres then return ngx.say("table call: ", err) end
                local jres
                jres, err = conn:unary("EchoAllKinds", json.encode(msg),
                                       { json = true, proto_names = true })
                if not jres then return ngx.say("json call: ", err) end
                local d = p.diff(json.decode(jres.body), tres.body, "body")
                if d then out[#out + 1] = "vs JSON: " .. d end
                -- a nil body is the empty message, sent as a table
                local nres, nerr = conn:unary("SayHello", nil)
                if not nres or nres.body.message ~= "Hello !" then out[#out + 1] = "nil body: " .. tostring(nerr) end
                -- the Lua side alone: the format, malformed data, JSON text
                local want = { a = { 1, "x" }, b = ngx.null }
                local res = proto.finish({ code = 0, body = "\0" .. sbuf.encode(want) }, "m")
                d = p.diff(want, res and res.body, "finish")
                if d then out[#out + 1] = d end
                local r2, e2, raw = proto.finish({ code = 0, body = "\0" .. sbuf.encode(want) .. "x" }, "m")
                if r2 or e2 ~= "bad response: m: malformed reply: trailing bytes" or not raw then
                    out[#out + 1] = "trailing bytes: " .. tostring(e2)
                end
                r2, e2 = proto.finish({ code = 0, body = "\0\9\5" }, "m")
                if r2 or e2 ~= "bad response: m: malformed reply: unexpected end of buffer" then
                    out[#out + 1] = "truncated: " .. tostring(e2)
                end
                r2, e2 = proto.finish({ code = 0, body = '{"a":[1]}' }, "m")
                if r2 or e2 ~= "bad response: m: malformed reply: not in string.buffer's format" then
                    out[#out + 1] = "JSON text for a table: " .. tostring(e2)
                end
                -- a reply deeper than a Lua table holds (Deep: 101 levels):
                -- the documented error and the answer's bytes; as JSON text
                -- with json = true
                local deep_opts = { request = "demo.HelloRequest", response = "demo.AllKinds" }
                r2, e2, raw = conn:unary("Deep", { name = "101" }, deep_opts)
                if r2 or e2 ~= "bad response: demo.AllKinds: nested more than 100 levels, more than a Lua table reply holds (json = true gives the JSON text)"
                   or not raw.res or #raw.res.body == 0 then
                    out[#out + 1] = "deep reply: " .. tostring(e2)
                end
                deep_opts.json = true
                r2, e2 = conn:unary("Deep", '{"name":"101"}', deep_opts)
                if not r2 or select(2, r2.body:gsub('"child"', "")) ~= 99 then out[#out + 1] = "deep JSON reply: " .. tostring(e2) end
                deep_opts.json = nil
                r2, e2 = conn:unary("Deep", { name = "100" }, deep_opts)
                if not r2 then out[#out + 1] = "100 levels: " .. tostring(e2) end
                ngx.say(#out == 0 and "ok" or table.concat(out, "\n"))
`) + loc("/traces", `
                -- Over 300 hot table calls (proto.lua says why):
                -- * the request's string.buffer encode never enters a
                --   trace: the recorder reaches its wrapper's first
                --   bytecode (pc 0, where it stops) but records no other;
                -- * apart from there, no trace through the module's files
                --   is given up: the JIT compiles the rest of the path,
                --   the reply's decode included (kept out of the JIT as
                --   well, it cost 1.5-2 us more per call).
                local p = require "pbt"
                local proto = require "resty.ffi.qrpc.proto"
                local conn = assert(p.conn())
                local traceerr = require("jit.vmdef").traceerr
                local never = {}
                for _, f in ipairs(proto._not_compiled) do never[f] = true end
                local aborts, compiled, inside = {}, 0, 0
                local function rec(_, func, pc)
                    if never[func] and pc > 0 then inside = inside + 1 end
                end
                local function ev(what, _, func, pc, err, info)
                    local i = debug.getinfo(func, "S")
                    if never[func] or not i.source:find("resty/ffi/qrpc", 1, true) then return end
                    if what == "stop" then
                        compiled = compiled + 1
                        return
                    end
                    local why = what == "abort" and traceerr[err] or ""
                    -- a loop closing elsewhere than where its trace began
                    -- is the JIT looking for a trace's shape, not giving
                    -- up on the code
                    if what == "abort" and not why:find("loop", 1, true) then
                        aborts[#aborts + 1] = i.short_src .. ":" .. i.linedefined .. " pc " .. pc
                                              .. ": " .. why:format(info)
                    end
                end
                -- the traces of the calls before are thrown away: the
                -- loop compiles the path afresh
                jit.flush()
                jit.attach(rec, "record")
                jit.attach(ev, "trace")
                local res, err
                for _ = 1, 300 do
                    res, err = conn:unary("EchoAllKinds", { text = "x", inner = { id = "i" } })
                    if not res then break end
                end
                jit.attach(rec)
                jit.attach(ev)
                if not res then return ngx.say("unary: ", err) end
                ngx.say(compiled > 0 and "compiled" or "none compiled", ", ", inside, " recorded in the encode, ",
                        #aborts, " aborted", #aborts > 0 and ": " or "", table.concat(aborts, ", "))
`) + loc("/tables", `
                -- odd tables: the expected answer or error, each
                local p = require "pbt"
                local proto = require "resty.ffi.qrpc.proto"
                local json = require "resty.ffi.qrpc.json"
                local ok_cjson, cjson = pcall(require, "cjson.safe")
                local conn = assert(p.conn())
                local out = {}
                local deep, d = {}, nil
                d = deep
                -- 100 tables with the body: as many as string.buffer encodes
                for _ = 1, 98 do d.meta = {} d = d.meta end
                local cyc = {}
                cyc.inner = cyc
                local cases = {
                    { t = { i32 = -0.0, i64 = 2^53, db = 123456789012345.6, u64 = 18446744073709551615ULL,
                            s64 = -9223372036854775807LL - 1, sf64 = 42LL },
                      want = { i64 = "9007199254740992", db = 123456789012345.6, u64 = "18446744073709551615",
                               s64 = "-9223372036854775808", sf64 = "42" } },
                    { t = { i32 = 1e20 }, err = "bad message: demo.AllKinds: i32: out of range for int32: 1e+20" },
                    { t = { i32 = 2^31 }, err = "bad message: demo.AllKinds: i32: out of range for int32: 2147483648" },
                    { t = { db = 0.1 + 0.2, ratios = { 1e300, -0.0, 5e-324 } },
                      want = { db = 0.1 + 0.2, ratios = { 1e300, -0.0, 5e-324 } } },
                    { t = { text = "q\"\\\n\0\127é\1" }, want = { text = "q\"\\\n\0\127é\1" } },
                    { t = { text = "\255" }, err = "bad message: demo.AllKinds: text: " },
                    { t = { tags = json.empty_array, colors = {} }, err = "bad message: demo.AllKinds: colors: expected array, got object" },
                    { t = { tags = json.empty_array }, want = {} },
                    { t = { byId = { [7] = { id = "s" }, [-1] = {} }, counts = { [1] = "1" } },
                      err = "bad message: demo.AllKinds: counts: expected object (map), got array" },
                    { t = { byId = { [7] = { id = "s" }, [-1] = {} } }, want = { byId = { ["7"] = { id = "s" }, ["-1"] = {} } } },
                    { t = { meta = { a = ngx.null, l = { 1, ngx.null } } }, want = { meta = { a = ngx.null, l = { 1, ngx.null } } } },
                    { t = { [true] = 1 }, err = "bad argument #3: body: table keys must be strings or integers (got boolean)" },
                    { t = { byId = { [1.5] = {} } }, err = "bad argument #3: body: table keys must be strings or integers (got 1.5)" },
                    { t = { text = ngx.null }, want = {} },
                    { t = { text = print }, err = "bad argument #3: body: cannot encode a function value" },
                    { t = { text = coroutine.create(function() end) }, err = "bad argument #3: body: cannot encode a thread value" },
                    { t = { text = 1i }, err = "bad argument #3: body: cannot encode a cdata value" },
                    { t = { meta = deep }, want = { meta = deep } },
                    { t = { meta = { deep } }, err = "bad argument #3: body: nested too deep (more than 100 levels, or a cycle)" },
                    { t = { meta = cyc }, err = "bad argument #3: body: nested too deep (more than 100 levels, or a cycle)" },
                    -- every field Go encodes straight from the table's bytes
                    -- (no map, Struct or null): field by field
                    { t = { i32 = -5, i64 = "-9", u32 = 7, u64 = "18446744073709551615", s32 = -1, s64 = "5",
                            f32 = 3, f64 = "4", sf32 = -2, sf64 = "-3", fl = 1.5, db = 0.25, flag = true,
                            text = "x\n", data = "AAEC", color = "COLOR_BLUE",
                            inner = { id = "i", values = { 1, -2 }, child = { id = "c" } },
                            tags = { "a", "" }, items = { { id = "x" }, {} }, big = { "1", "-1" },
                            colors = { "COLOR_RED", "COLOR_GREEN" }, ratios = { 0.5, -1e300 },
                            choiceNum = "12", at = "2024-02-29T23:59:59.500Z", took = "1.500s",
                            wrapped = "7", maybe = 0 },
                      want = { i32 = -5, i64 = "-9", u32 = 7, u64 = "18446744073709551615", s32 = -1, s64 = "5",
                               f32 = 3, f64 = "4", sf32 = -2, sf64 = "-3", fl = 1.5, db = 0.25, flag = true,
                               text = "x\n", data = "AAEC", color = "COLOR_BLUE",
                               inner = { id = "i", values = { 1, -2 }, child = { id = "c" } },
                               tags = { "a", "" }, items = { { id = "x" }, {} }, big = { "1", "-1" },
                               colors = { "COLOR_RED", "COLOR_GREEN" }, ratios = { 0.5, -1e300 },
                               choiceNum = "12", at = "2024-02-29T23:59:59.500Z", took = "1.500s",
                               wrapped = "7", maybe = 0 } },
                    { t = { nope = 1 }, err = "bad message: demo.AllKinds: nope: unknown field" },
                    { t = { nope = 1 }, discard = true, want = {} },
                }
                if ok_cjson and cjson.empty_array ~= nil then
                    cases[#cases + 1] = { t = { tags = cjson.empty_array }, want = {} }
                end
                for i, c in ipairs(cases) do
                    local res, err = conn:unary("EchoAllKinds", c.t, { discard_unknown = c.discard, proto_names = false })
                    local b = res and res.body or ("error: " .. tostring(err))
                    if c.err then
                        if type(b) ~= "string" or b:sub(1, 7 + #c.err) ~= "error: " .. c.err then
                            out[#out + 1] = "case " .. i .. ": " .. tostring(type(b) == "table" and json.encode(b) or b)
                                            .. " want " .. c.err
                        end
                    elseif c.want then
                        local dd = p.diff(c.want, b, "case " .. i)
                        if dd then out[#out + 1] = dd end
                    end
                end
                ngx.say(#out == 0 and "ok" or table.concat(out, "\n"))
`) + loc("/set", `
                local qrpc = require "resty.ffi.qrpc"
                local f = assert(io.open(require("qtest").proto_dir .. "/greeter.protoset", "rb"))
                local set = f:read("*a")
                f:close()
                -- the same files again: a no-op, twice
                assert(qrpc.proto.load_descriptor_set(set))
                assert(qrpc.proto.load_descriptor_set(set))
                assert(qrpc.proto.load(require("qtest").proto_dir .. "/greeter.proto"))
                ngx.say("ok")
`),
	})
	// The Lua helpers of the cases above.
	if err := os.WriteFile(filepath.Join(n.dir, "pbt.lua"), []byte(protoLua), 0o644); err != nil {
		t.Fatal(err)
	}

	get := func(path string) string {
		t.Helper()
		st, body := n.get(path)
		if st != 200 {
			t.Fatalf("%s: HTTP %d %s", path, st, body)
		}
		return body
	}
	if got := get("/roundtrip"); got != "ok\n" {
		t.Errorf("table round trip: %s", got)
	}
	if got := get("/json"); got != "ok\n" {
		t.Errorf("JSON round trip: %s", got)
	}
	if got := get("/hello"); got != "Hello per call!\n{\"message\":\"Hello json!\"}\n{\"message\":\"Hello table!\"}\nHello text!\nHello x!\n{\"name\":\"Hello !\"}\nevent sent\n" {
		t.Errorf("hello: %q", got)
	}
	if err := eventually(5e9, func() error {
		if v, _ := srv.lastName.Load().(string); v != "by event" {
			return os.ErrNotExist
		}
		return nil
	}); err != nil {
		t.Errorf("the event's HelloRequest did not arrive")
	}

	before := srv.requests.Load()
	want := []string{
		"bad message: demo.HelloRequest: nmae: unknown field",
		"bad message: demo.HelloRequest: name: expected string, got number 5",
		"bad message: demo.AllKinds: i32: out of range for int32: 2147483648",
		"bad message: demo.AllKinds: i32: not an integer: 1.5",
		"bad message: demo.AllKinds: items[1].id: expected string, got object",
		`bad message: demo.AllKinds: color: unknown value "PURPLE" of enum demo.Color`,
		"bad message: demo.AllKinds: tags: expected array, got object",
		"bad message: demo.HelloRequest: invalid JSON at offset 8: unexpected end of JSON input",
		"bad message: demo.Nope: unknown message type",
		"bad argument #3: body must be a table for request demo.HelloRequest (got string; pass json = true for a JSON string)",
		`bad argument #3: body must be a JSON string with json = "request" (got table)`,
		`bad argument #4: json must be true, false, "request" or "response"`,
		"bad argument #3: body: cannot encode a function value",
		"bad argument #3: body: nested too deep (more than 100 levels, or a cycle)",
		"bad argument #3: body: nested too deep (more than 100 levels, or a cycle)",
		"bad argument #3: body: cannot encode a thread value",
		"bad argument #3: body: cannot encode a userdata value",
		"bad message: demo.HelloRequest: nope: unknown field",
		"bad response: demo.HelloReply: cannot parse invalid wire-format data | raw: /wAgbm90IHByb3RvYnVm",
		`bad argument #4: request must be a message name like "pkg.Msg"`,
		"bad argument #4: opts raised an error: ",
		"bad argument #2: methods raised an error: ",
		"bad proto: " + dir + "/broken.proto:5:1: syntax error: expecting ';'",
		"bad proto: " + dir + "/nothere.proto: file not found",
		"bad proto: descriptor set: ",
		"bad argument #1: path must not be empty",
		"init: bad proto: " + dir + "/absent.proto: file not found",
	}
	got := strings.Split(strings.TrimSuffix(get("/bad"), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("bad inputs: %d lines, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("bad input %d:\n got  %s\n want %s", i, got[i], want[i])
		}
	}
	// Only the Garbage call reached the server: every bad request was
	// refused before sending.
	if d := srv.requests.Load() - before; d != 1 {
		t.Errorf("%d requests reached the server during the bad-input cases, want 1 (Garbage)", d)
	}
	if got := get("/tables"); got != "ok\n" {
		t.Errorf("odd request tables:\n%s", got)
	}
	if got := get("/jsonlib"); got != "ok\n" {
		t.Errorf("json.lua:\n%s", got)
	}
	if got := get("/luatables"); got != "ok\n" {
		t.Errorf("replies as Lua tables:\n%s", got)
	}
	if got := get("/traces"); got != "compiled, 0 recorded in the encode, 0 aborted\n" {
		t.Errorf("300 hot table calls: the encode recorded in traces, or traces given up: %s", got)
	}
	if got := get("/set"); got != "ok\n" {
		t.Errorf("descriptor set: %s", got)
	}
}

// The lua-resty-ffi host carries protobuf calls too (its task answers
// carry QRPC_BAD_RESPONSE's data like any other).
func TestProtobufRestyFFIHost(t *testing.T) {
	requireNginx(t)
	if shimPath == "" {
		t.Skipf("lua-resty-ffi stand-in unavailable: %v", shimErr)
	}
	srv := startPBServer(t)
	dir := protoDir(t)
	runBlocks(t, []block{{
		name: "protobuf through the task queue",
		conf: ngxConf{
			Extra: map[string]string{"pb_addr": srv.addr, "proto_dir": dir},
			InitByLua: `
        local qt = require "qtest"
        require("fake_resty_ffi").install(qt.shim)
        assert(require("resty.ffi.qrpc").configure{ lib = qt.lib, socket_dir = qt.dir .. "/run" })
        assert(require("resty.ffi.qrpc").proto.load(qt.proto_dir .. "/greeter.proto"))`,
			Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qt.connect({ methods = {
                    SayHello = { request = "demo.HelloRequest", response = "demo.HelloReply" } } }, qt.pb_addr))
                ngx.say("host: ", qrpc.stats().host)
                local res, err = conn:unary("SayHello", { name = "ffi" })
                ngx.say(res and res.body.message or err)
                res, err = conn:unary("SayHello", '{"name":"json"}', { json = true })
                ngx.say(res and res.body or err)
                ngx.say((select(2, conn:unary("SayHello", { nope = 1 }))))
                local raw
                res, err, raw = conn:unary("Garbage", "", { response = "demo.HelloReply" })
                ngx.say(tostring(res), " ", err, " ", raw.res and #raw.res.body)`),
		},
		body: lines(
			"host: resty_ffi",
			"Hello ffi!",
			`{"message":"Hello json!"}`,
			"bad message: demo.HelloRequest: nope: unknown field",
			"nil bad response: demo.HelloReply: cannot parse invalid wire-format data 15",
		),
	}})
}

// Without string.buffer (a LuaJIT 2.0, or one built without it) the
// module does not load, and says which module it lacks: the module
// removed from require before resty.ffi.qrpc loads.
func TestProtobufWithoutStringBuffer(t *testing.T) {
	init := lines(
		`        package.loaded["string.buffer"] = nil`,
		`        package.preload["string.buffer"] = nil`,
		`        local ok, err = pcall(require, "resty.ffi.qrpc")`,
		`        package.loaded.no_sbuf = ok and "loaded" or tostring(err)`,
	)
	n := startNginx(t, ngxConf{
		Workers:   1,
		InitByLua: init,
		Server: loc("/t", `
                ngx.say(package.loaded.no_sbuf)`),
	})
	st, body := n.get("/t")
	if st != 200 || !strings.Contains(body, "module 'string.buffer' not found") {
		t.Fatalf("HTTP %d: %s", st, body)
	}
}

// qrpc.proto.load with import_paths: a file named by its import name
// (found in the first directory) whose import lives in the second, both
// usable in calls; and the option's errors.
func TestProtoImportPaths(t *testing.T) {
	srv := startPBServer(t)
	root := protoDir(t)
	files := map[string]string{
		// wire-compatible with demo.HelloRequest / HelloReply, which the server speaks
		"b/common/names.proto": "syntax = \"proto3\";\npackage common;\n" +
			"message Hello { string name = 1; }\nmessage Reply { string message = 1; }\n",
		"a/api.proto": "syntax = \"proto3\";\npackage imp;\nimport \"common/names.proto\";\n" +
			"message Api { string name = 1; common.Hello unused = 2; }\n",
		// loaded by path, without import paths: its import is not found
		"b/common/more.proto": "syntax = \"proto3\";\npackage common;\nmessage More { int32 n = 1; }\n",
		"a/other.proto": "syntax = \"proto3\";\npackage imp;\nimport \"common/more.proto\";\n" +
			"message Other { common.More m = 1; }\n",
	}
	for name, src := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runBlocks(t, []block{{
		name: "import paths",
		conf: ngxConf{
			Extra: map[string]string{"pb_addr": srv.addr, "imp_a": root + "/a", "imp_b": root + "/b"},
			InitByLua: `
        local qt = require "qtest"
        local qrpc = require "resty.ffi.qrpc"
        assert(qrpc.configure{ lib = qt.lib, socket_dir = qt.dir .. "/run" })
        assert(qrpc.proto.load("api.proto", { import_paths = { qt.imp_a, qt.imp_b } }))`,
			Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local conn = assert(qt.connect({}, qt.pb_addr))
                local res, err = conn:unary("SayHello", { name = "imported" },
                    { request = "common.Hello", response = "common.Reply" })
                ngx.say(res and res.body.message or err)
                res, err = conn:unary("SayHello", { name = "by name" },
                    { request = "imp.Api", response = "common.Reply" })
                ngx.say(res and res.body.message or err)
                ngx.say(select(2, qrpc.proto.load("api.proto", { import_paths = "x" })))
                ngx.say(select(2, qrpc.proto.load("api.proto", { import_paths = { "" } })))
                ngx.say(select(2, qrpc.proto.load("api.proto", { import_paths = { qt.imp_a }, path = 1 })))
                -- the import is not under the file's own directory
                local ok
                ok, err = qrpc.proto.load(qt.imp_a .. "/other.proto")
                ngx.say(tostring(ok), " ", (tostring(err):gsub(qt.imp_a:gsub("%p", "%%%0"), "A")))`),
		},
		body: lines(
			"Hello imported!",
			"Hello by name!",
			"bad argument #2: import_paths must be a list of directories",
			"bad argument #2: import_paths[1] must be a directory path",
			"bad argument #2: unknown option 'path'",
			"nil bad proto: A/other.proto:3:8: import not found in import paths (A)",
		),
	}})
}
