package transcode

import (
	"bytes"
	"encoding/binary"
	"math"
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

// encodeTable is the request path of a table (internal/bridge): the
// direct path, else the JSON text and Encode.
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
