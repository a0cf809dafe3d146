package transcode

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
)

// Lua values in string.buffer's format, for tables written by hand.
func serNum(x float64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{luaNum}, math.Float64bits(x))
}

func luaList(vals ...[]byte) []byte {
	out := []byte{luaArray1, byte(len(vals) + 1)}
	for _, v := range vals {
		out = append(out, v...)
	}
	return out
}

// luaObj is a table of one string key.
func luaObj(key string, val []byte) []byte {
	out := []byte{luaHash, 1, byte(luaStr + len(key))}
	return append(append(out, key...), val...)
}

// luaObjN is a table of string keys.
func luaObjN(kv ...any) []byte {
	out := []byte{luaHash, byte(len(kv) / 2)}
	for i := 0; i < len(kv); i += 2 {
		k := kv[i].(string)
		out = append(append(append(out, byte(luaStr+len(k))), k...), kv[i+1].([]byte)...)
	}
	return out
}

func serStr(s string) []byte { return append([]byte{byte(luaStr + len(s))}, s...) }

// serInt64 and serUint64 are LuaJIT's 64-bit integer cdata (5LL, 5ULL).
func serInt64(n int64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{0x10}, uint64(n))
}

func serUint64(n uint64) []byte { return binary.LittleEndian.AppendUint64([]byte{0x11}, n) }

// encodeTable is the request path of a table (internal/bridge): the
// direct path, else viaJSON.
func encodeTable(m *Message, ser []byte) ([]byte, error) {
	if out, ok := m.EncodeLua(nil, ser); ok {
		return out, nil
	}
	return viaJSON(m, ser)
}

// TestEncodeLuaBigIntegers: a Lua number beyond 2^53 for a 64-bit
// integer field is the integer the double holds, exactly (2^60 was sent as
// 1152921504606847000, from the JSON text 1.152921504606847e+18); one out
// of the field's range is refused (2^63 for int64 was sent as
// 9223372036854775800).
func TestEncodeLuaBigIntegers(t *testing.T) {
	r := demoRegistry(t)
	m := mustMessage(t, r, "demo.AllKinds")
	for _, c := range []struct {
		key  string
		val  []byte
		want proto.Message // nil: refused with err
		err  string
	}{
		{"i64", serNum(1 << 60), &demopb.AllKinds{I64: 1 << 60}, ""},
		{"i64", serNum(-(1 << 63)), &demopb.AllKinds{I64: math.MinInt64}, ""},
		{"i64", serNum(1e18), &demopb.AllKinds{I64: 1e18}, ""},
		{"i64", serNum(1 << 53), &demopb.AllKinds{I64: 1 << 53}, ""},
		{"u64", serNum(1 << 63), &demopb.AllKinds{U64: 1 << 63}, ""},
		{"u64", serNum(18446744073709549568), &demopb.AllKinds{U64: 18446744073709549568}, ""},
		{"f64", serNum(1 << 63), &demopb.AllKinds{F64: 1 << 63}, ""},
		{"sf64", serNum(-(1 << 62)), &demopb.AllKinds{Sf64: -(1 << 62)}, ""},
		{"s64", serNum(1<<62 + 1<<12), &demopb.AllKinds{S64: 1<<62 + 1<<12}, ""},
		{"big", luaList(serNum(1 << 60)), &demopb.AllKinds{Big: []int64{1 << 60}}, ""},
		{"wrapped", serNum(1 << 60), &demopb.AllKinds{Wrapped: wrapperspb.Int64(1 << 60)}, ""},
		{"db", serNum(1 << 60), &demopb.AllKinds{Db: 1 << 60}, ""},
		{"fl", serNum(1<<60 + 1<<8), &demopb.AllKinds{Fl: 1 << 60}, ""},
		{"i64", serNum(1 << 63), nil, "bad message: demo.AllKinds: i64: out of range for int64: 9223372036854775808"},
		{"sf64", serNum(-(1 << 64)), nil, "bad message: demo.AllKinds: sf64: out of range for sfixed64: -1.8446744073709552e+19"},
		{"u64", serNum(1 << 64), nil, "bad message: demo.AllKinds: u64: out of range for uint64: 1.8446744073709552e+19"},
		{"f64", serNum(-(1 << 60)), nil, "bad message: demo.AllKinds: f64: out of range for fixed64: -1152921504606846976"},
		{"u64", serNum(-1), nil, "bad message: demo.AllKinds: u64: out of range for uint64: -1"},
		{"i32", serNum(1 << 60), nil, "bad message: demo.AllKinds: i32: out of range for int32: 1152921504606846976"},
	} {
		got, err := encodeTable(m, luaObj(c.key, c.val))
		if c.want == nil {
			if err == nil || err.Error() != c.err {
				t.Errorf("%s = %x: %x, %v; want %q", c.key, c.val[1:], got, err, c.err)
			}
			continue
		}
		want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c.want)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s = %x: %x, %v; want %x", c.key, c.val[1:], got, err, want)
		}
	}
}

const marksProto = `syntax = "proto3"; package mk;
import "google/protobuf/any.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/wrappers.proto";
message A {
  google.protobuf.Any an = 1;
  map<string, google.protobuf.Value> mv = 2;
  repeated google.protobuf.Struct rs = 3;
  A next = 4;
  google.protobuf.ListValue lv = 5;
  google.protobuf.DoubleValue wd = 6;
  google.protobuf.Int64Value w64 = 7;
  double db = 8;
  int64 i64 = 9;
}`

// TestEncodeLuaMarksInValues: NaN, ±inf and a 64-bit integer cdata
// inside a Struct, Value or ListValue (wherever it sits: a field, a map,
// a list, an Any) were sent as the strings "NaN", "Infinity",
// "9007199254740993"; proto3 JSON has no such numbers (protojson refuses
// to write them), so they are refused, and a cdata a double holds exactly
// is the number. Outside those types they stay what they were.
func TestEncodeLuaMarksInValues(t *testing.T) {
	r := demoRegistry(t)
	ak := mustMessage(t, r, "demo.AllKinds")
	dir := writeFiles(t, map[string]string{"mk.proto": marksProto})
	if err := r.LoadFile(dir+"/mk.proto", nil); err != nil {
		t.Fatal(err)
	}
	mk := mustMessage(t, r, "mk.A")
	nan, inf := serNum(math.NaN()), serNum(math.Inf(1))
	anyOf := func(typ string, rest ...any) []byte {
		return luaObjN(append([]any{"@type", serStr("type.googleapis.com/" + typ)}, rest...)...)
	}
	for _, c := range []struct {
		m    *Message
		ser  []byte
		want string // protojson's reading of the JSON, or "!" and the error
	}{
		{ak, luaObj("meta", luaObj("n", nan)), "!bad message: demo.AllKinds: meta.n: expected a finite number (google.protobuf.Value), got NaN"},
		{ak, luaObj("value", inf), "!bad message: demo.AllKinds: value: expected a finite number (google.protobuf.Value), got Infinity"},
		{ak, luaObj("meta", luaObj("l", luaList(serNum(1), serNum(math.Inf(-1))))), "!bad message: demo.AllKinds: meta.l[1]: expected a finite number (google.protobuf.Value), got -Infinity"},
		{ak, luaObj("meta", luaObj("n", serInt64(9007199254740993))), "!bad message: demo.AllKinds: meta.n: not exact as a double (google.protobuf.Value): 9007199254740993"},
		{ak, luaObj("value", serUint64(18446744073709551615)), "!bad message: demo.AllKinds: value: not exact as a double (google.protobuf.Value): 18446744073709551615"},
		{ak, luaObj("meta", luaObj("n", serInt64(-5))), `{"meta":{"n":-5}}`},
		{ak, luaObj("value", serUint64(1<<60)), `{"value":1152921504606846976}`},
		{ak, luaObj("meta", luaObj("s", serStr("NaN"))), `{"meta":{"s":"NaN"}}`},
		{ak, luaObjN("db", nan, "i64", serInt64(9007199254740993), "meta", luaObj("a", serNum(1))), `{"db":"NaN","i64":"9007199254740993","meta":{"a":1}}`},
		{mk, luaObj("mv", luaObj("k", nan)), `!bad message: mk.A: mv["k"]: expected a finite number (google.protobuf.Value), got NaN`},
		{mk, luaObj("rs", luaList(luaObj("a", serNum(1)), luaObj("b", inf))), "!bad message: mk.A: rs[1].b: expected a finite number (google.protobuf.Value), got Infinity"},
		{mk, luaObj("next", luaObj("lv", luaList(nan))), "!bad message: mk.A: next.lv[0]: expected a finite number (google.protobuf.Value), got NaN"},
		{mk, luaObj("an", anyOf("google.protobuf.Value", "value", nan)), "!bad message: mk.A: an.value: expected a finite number (google.protobuf.Value), got NaN"},
		{mk, luaObj("an", anyOf("mk.A", "mv", luaObj("k", serInt64(7)))), `{"an":{"@type":"type.googleapis.com/mk.A","mv":{"k":7}}}`},
		{mk, luaObj("an", anyOf("mk.A", "an", anyOf("google.protobuf.Struct", "value", luaObj("x", inf)))), "!bad message: mk.A: an.an.value.x: expected a finite number (google.protobuf.Value), got Infinity"},
		{mk, luaObjN("wd", nan, "w64", serInt64(9007199254740993)), `{"wd":"NaN","w64":"9007199254740993"}`},
	} {
		got, err := encodeTable(c.m, c.ser)
		if strings.HasPrefix(c.want, "!") {
			if err == nil || err.Error() != c.want[1:] {
				t.Errorf("%x: %x, %v; want %s", c.ser, got, err, c.want[1:])
			}
			continue
		}
		want, werr := c.m.Encode(nil, []byte(c.want), EncodeOptions{})
		if werr != nil {
			t.Fatal(werr)
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%x: %x, %v; want %s (%x)", c.ser, got, err, c.want, want)
		}
	}
}
