package nginx

import (
	"os"
	"path/filepath"
	"testing"
)

// mapKeysProto has a map for each kind of integer key, each answered by
// the shared server's echo (the bytes back as they came): the answer,
// read as the same message, is what the request encoded.
const mapKeysProto = `syntax = "proto3";
package mk;
import "google/protobuf/struct.proto";
message Item { string id = 1; }
message Keys {
  map<int64, Item> by_id = 1;
  map<uint64, string> by_u = 2;
  map<int32, string> by_i32 = 3;
  map<uint32, string> by_u32 = 4;
  map<sint64, string> by_s64 = 5;
  map<fixed64, string> by_f64 = 6;
  map<sfixed64, string> by_sf64 = 7;
  map<string, string> by_name = 8;
  map<bool, string> by_flag = 9;
  int64 n = 10;
  google.protobuf.Struct meta = 11;
}
`

// LuaJIT's 64-bit integers (cdata) as map keys in a request table: every
// digit for a 64-bit key, the key's type words a key it cannot hold as it
// words a value out of range; json.lua writes them as Go does.
func TestProtobufInt64MapKeys(t *testing.T) {
	root := protoDir(t)
	if err := os.WriteFile(filepath.Join(root, "mk.proto"), []byte(mapKeysProto), 0o644); err != nil {
		t.Fatal(err)
	}
	runBlocks(t, []block{{
		name: "int64 cdata map keys",
		conf: ngxConf{
			Extra: map[string]string{"mk": root + "/mk.proto"},
			InitByLua: `
        local qt = require "qtest"
        local qrpc = require "resty.ffi.qrpc"
        assert(qrpc.configure{ lib = qt.lib, socket_dir = qt.dir .. "/run" })
        assert(qrpc.proto.load(qt.mk))`,
			Server: loc("/t", `
                local qt = require "qtest"
                local json = require "resty.ffi.qrpc.json"
                local conn = assert(qt.connect({ methods = {
                    echo = { request = "mk.Keys", response = "mk.Keys" } } }))
                local function as_json(body)
                    local res, err = conn:unary("echo", body, { json = "response" })
                    return res and res.body or err
                end
                -- table in, JSON text out
                ngx.say(as_json({ byId = { [9007199254740993LL] = { id = "a" } } }))
                ngx.say(as_json({ byId = { [-9223372036854775807LL - 1] = { id = "least" } } }))
                ngx.say(as_json({ byU = { [18446744073709551615ULL] = "most" } }))
                ngx.say(as_json({ byS64 = { [-9007199254740993LL] = "s" }, byF64 = { [18446744073709551615ULL] = "f" },
                                  bySf64 = { [-9223372036854775807LL] = "sf" } }))
                ngx.say(as_json({ byI32 = { [-5LL] = "c", [7] = "n", ["9"] = "s" }, byU32 = { [4294967295ULL] = "u" } }))
                ngx.say(as_json({ byName = { [12LL] = "x" }, meta = { [5LL] = 1 } }))
                -- table in, table out
                local res, err = conn:unary("echo", { byId = { [9007199254740993LL] = { id = "t" } } })
                ngx.say(res and res.body.by_id["9007199254740993"].id or err)
                -- refused: the key's type cannot hold it (as for a value), a
                -- key given twice, a cdata that is no integer
                ngx.say(as_json({ byI32 = { [1099511627776LL] = "x" } }))
                ngx.say(as_json({ byU32 = { [4294967296ULL] = "x" } }))
                ngx.say(as_json({ byU = { [-1LL] = "x" } }))
                ngx.say(as_json({ byId = { [18446744073709551615ULL] = {} } }))
                ngx.say(as_json({ n = 18446744073709551615ULL }))
                ngx.say(as_json({ byId = { [7LL] = {}, [7] = {} } }))
                ngx.say(as_json({ byFlag = { [1LL] = "x" } }))
                ngx.say(as_json({ byI32 = { [1i] = "x" } }))
                ngx.say(as_json({ byId = { [2^60] = {} } }))
                -- json.lua: the same JSON text
                for _, t in ipairs({ { byId = { [9007199254740993LL] = { id = "j" } } },
                                     { byU = { [18446744073709551615ULL] = "m" } } }) do
                    local text = json.encode(t)
                    res, err = conn:unary("echo", text, { json = true })
                    ngx.say(text, " ", res and res.body or err)
                end`),
		},
		body: lines(
			`{"byId":{"9007199254740993":{"id":"a"}}}`,
			`{"byId":{"-9223372036854775808":{"id":"least"}}}`,
			`{"byU":{"18446744073709551615":"most"}}`,
			`{"byS64":{"-9007199254740993":"s"},"byF64":{"18446744073709551615":"f"},"bySf64":{"-9223372036854775807":"sf"}}`,
			`{"byI32":{"-5":"c","7":"n","9":"s"},"byU32":{"4294967295":"u"}}`,
			`{"byName":{"12":"x"},"meta":{"5":1}}`,
			`t`,
			`bad message: mk.Keys: byI32["1099511627776"]: invalid map key: out of range for int32: 1099511627776`,
			`bad message: mk.Keys: byU32["4294967296"]: invalid map key: out of range for uint32: 4294967296`,
			`bad message: mk.Keys: byU["-1"]: invalid map key: out of range for uint64: -1`,
			`bad message: mk.Keys: byId["18446744073709551615"]: invalid map key: out of range for int64: 18446744073709551615`,
			`bad message: mk.Keys: n: out of range for int64: 18446744073709551615`,
			`bad message: mk.Keys: byId["7"]: duplicate map key`,
			`bad message: mk.Keys: byFlag["1"]: invalid map key: expected bool, got string "1"`,
			`bad argument #3: body: table keys must be strings or integers (got cdata)`,
			`bad argument #3: body: table keys must be strings or integers (got 1.1529215046068e+18)`,
			`{"byId":{"9007199254740993":{"id":"j"}}} {"byId":{"9007199254740993":{"id":"j"}}}`,
			`{"byU":{"18446744073709551615":"m"}} {"byU":{"18446744073709551615":"m"}}`,
		),
	}})
}
