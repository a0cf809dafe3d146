package transcode

import (
	"encoding/base64"
	"math"
	"strconv"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

// DecodeLua appends the response pb as a Lua table in LuaJIT's
// string.buffer serialization format: the bytes luaserial.FromJSON writes for
// Decode's JSON text, byte for byte (FuzzDecodeLua checks it), read
// straight from the wire data. The JSON text and its parse were about
// half of what a table-mode response cost on Go's side.
//
// ok == false leaves the response to Decode and FromJSON, which give the
// answer or the error: malformed or unusual wire data (the fast decoder's
// cases), nesting near LuaJIT's limit, EmitDefaults.
func (m *Message) DecodeLua(dst, pb []byte, o DecodeOptions) ([]byte, bool) {
	if o.EmitDefaults {
		return dst, false
	}
	d := fastDecoder{reg: m.reg, protoNames: o.ProtoNames, lua: true}
	out, ok := d.message(dst, m.plan, pb)
	if !ok {
		return dst, false
	}
	return out, true
}

// luaScalar is jsonScalar's value as FromJSON reads it back: numbers are
// doubles, and what JSON writes as a string (64-bit integers, bytes in
// base64, enum names, NaN and the infinities) is a string.
func (d *fastDecoder) luaScalar(out []byte, f *fieldPlan, e entry) ([]byte, bool) {
	switch f.kind {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return luaserial.AppendNumber(out, float64(signedValue(f.kind, e.v))), true
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return luaserial.AppendNumber(out, float64(uint32(e.v))), true
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		var tmp [24]byte
		return luaserial.AppendString(out, strconv.AppendInt(tmp[:0], signedValue(f.kind, e.v), 10)), true
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		var tmp [24]byte
		return luaserial.AppendString(out, strconv.AppendUint(tmp[:0], e.v, 10)), true
	case protoreflect.BoolKind:
		return luaserial.AppendBool(out, e.v != 0), true
	case protoreflect.FloatKind:
		x := float64(math.Float32frombits(uint32(e.v)))
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return luaNonFinite(out, x), true
		}
		// JSON has the shortest text that reads back as the float32;
		// read as a double, that is not float64(x) (0.1f is 0.1 there).
		var tmp [32]byte
		v, err := strconv.ParseFloat(string(appendFloat(tmp[:0], x, 32)), 64)
		if err != nil {
			return out, false
		}
		return luaserial.AppendNumber(out, v), true
	case protoreflect.DoubleKind:
		// The shortest text of a double reads back as the same double.
		x := math.Float64frombits(e.v)
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return luaNonFinite(out, x), true
		}
		return luaserial.AppendNumber(out, x), true
	case protoreflect.StringKind:
		// Valid UTF-8: message, mapValue and wrapper check every string
		// as they read it (the JSON form checks here again, the cost of a
		// second pass over each string).
		return luaserial.AppendString(out, e.b), true
	case protoreflect.BytesKind:
		out = luaserial.AppendStringHeader(out, base64.StdEncoding.EncodedLen(len(e.b)))
		return base64.StdEncoding.AppendEncode(out, e.b), true
	case protoreflect.EnumKind:
		if f.nullValue {
			return luaserial.AppendNull(out), true
		}
		n := protoreflect.EnumNumber(int32(e.v))
		if uint64(n) < uint64(len(f.enumByNum)) && f.enumByNum[n] != "" {
			return luaserial.AppendString(out, f.enumByNum[n]), true
		}
		if f.enumByNum == nil {
			if ev := f.fd.Enum().Values().ByNumber(n); ev != nil {
				return luaserial.AppendString(out, string(ev.Name())), true
			}
		}
		return luaserial.AppendNumber(out, float64(n)), true
	}
	return out, false
}

// luaNonFinite writes NaN and the infinities as protojson's strings.
func luaNonFinite(out []byte, x float64) []byte {
	switch {
	case math.IsNaN(x):
		return luaserial.AppendString(out, "NaN")
	case x > 0:
		return luaserial.AppendString(out, "Infinity")
	}
	return luaserial.AppendString(out, "-Infinity")
}
