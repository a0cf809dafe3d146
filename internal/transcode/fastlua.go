package transcode

import (
	"encoding/binary"
	"math"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

// EncodeLua appends the protobuf encoding of ser, a Lua table in LuaJIT's
// string.buffer serialization format (what the Lua module sends with
// QRPC_F_LUA_REQUEST), reading the table directly. ok == false leaves the
// call to the JSON path (internal/luaserial's ToJSON, then Encode), which
// either encodes it or says what is wrong: this path covers messages of
// string-keyed tables, scalars, enums by name, nested messages, lists,
// Timestamp, Duration and the wrappers, and gives up on anything else
// (maps, oneofs set twice, null, unknown fields, integer-keyed tables,
// 64-bit cdata...). When it succeeds its bytes are the JSON path's, byte
// for byte: FuzzEncodeLua checks that.
func (m *Message) EncodeLua(dst, ser []byte) ([]byte, bool) {
	le := fastEncoder{in: ser, lua: true}
	out, ok := le.encode(dst, m.plan)
	if !ok {
		return dst, false
	}
	return out, true
}

// Tags of string.buffer's format (see internal/luaserial).
const (
	luaFalse  = 0x01
	luaTrue   = 0x02
	luaNum    = 0x07
	luaTab    = 0x08 // empty table
	luaHash   = 0x09 // h.U h*{key value}
	luaArray1 = 0x0c // a.U (a-1)*value: 1-based array
	luaTabMT  = 0x0e // (index-1).U table: a table with one of the array metatables
	luaStr    = 0x20 // (0x20+len).U bytes
)

func (e *fastEncoder) luaTag() byte {
	if e.pos < len(e.in) {
		return e.in[e.pos]
	}
	return 0
}

func (e *fastEncoder) luaU124() (int, bool) {
	in := e.in
	if e.pos >= len(in) {
		return 0, false
	}
	b := in[e.pos]
	switch {
	case b < 0xe0:
		e.pos++
		return int(b), true
	case b < 0xff:
		if e.pos+2 > len(in) {
			return 0, false
		}
		v := (int(b&0x1f)<<8 | int(in[e.pos+1])) + 0xe0
		e.pos += 2
		return v, true
	}
	if e.pos+5 > len(in) {
		return 0, false
	}
	v := binary.LittleEndian.Uint32(in[e.pos+1:])
	e.pos += 5
	return int(v), true
}

// luaShortString reads a string shorter than 192 bytes, whose tag holds
// its length, without a call; ok is false for anything else, which
// luaString then reads.
func (e *fastEncoder) luaShortString() ([]byte, bool) {
	in, pos := e.in, e.pos
	if pos < len(in) && in[pos] >= luaStr && in[pos] < 0xe0 {
		if end := pos + 1 + int(in[pos]-luaStr); end <= len(in) {
			e.pos = end
			return in[pos+1 : end], true
		}
	}
	return nil, false
}

// validUTF8 is utf8.Valid, taking a short ASCII string (most keys and
// values) without a call.
func validUTF8(s []byte) bool {
	if len(s) > 16 {
		return utf8.Valid(s)
	}
	for _, c := range s {
		if c >= utf8.RuneSelf {
			return utf8.Valid(s)
		}
	}
	return true
}

// luaString reads a string (its tag included); ok is false for another
// value.
func (e *fastEncoder) luaString() ([]byte, bool) {
	if e.luaTag() < luaStr {
		return nil, false
	}
	v, ok := e.luaU124()
	n := v - luaStr
	if !ok || n < 0 || n > len(e.in)-e.pos {
		return nil, false
	}
	s := e.in[e.pos : e.pos+n]
	e.pos += n
	return s, true
}

// luaNumber reads a number.
func (e *fastEncoder) luaNumber() (float64, bool) {
	if e.luaTag() != luaNum || e.pos+9 > len(e.in) {
		return 0, false
	}
	x := math.Float64frombits(binary.LittleEndian.Uint64(e.in[e.pos+1:]))
	e.pos += 9
	return x, true
}

// luaBool is boolValue for the Lua table.
func (e *fastEncoder) luaBool() (v, ok bool) {
	switch e.luaTag() {
	case luaTrue:
		e.pos++
		return true, true
	case luaFalse:
		e.pos++
		return false, true
	}
	return false, false
}

// luaFloat32 is a float field's value for the finite, non-zero number x:
// the JSON text the Lua module writes for x, rounded to float32 as the
// JSON path does (rounding x itself could differ: double rounding).
func luaFloat32(x float64) (float64, bool) {
	var buf [32]byte
	y, err := strconv.ParseFloat(string(luaNumberText(buf[:0], x)), 32)
	return y, err == nil
}

// luaInt is x as the JSON path reads it for an integer field: the JSON
// text of an integral number below 1e15 in magnitude is its digits,
// anything else (a fraction, an exponent) is not a plain integer.
func luaInt(x float64) (int64, bool) {
	if x != math.Trunc(x) || x <= -1e15 || x >= 1e15 {
		return 0, false
	}
	return int64(x), true
}

// intWire is intEntry for a value already parsed.
func intWire(k protoreflect.Kind, n int64) (uint64, bool) {
	switch k {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		if n < math.MinInt32 || n > math.MaxInt32 {
			return 0, false
		}
		switch k {
		case protoreflect.Sint32Kind:
			return protowire.EncodeZigZag(n), true
		case protoreflect.Sfixed32Kind:
			return uint64(uint32(int32(n))), true
		}
		return uint64(n), true
	case protoreflect.Int64Kind, protoreflect.Sfixed64Kind:
		return uint64(n), true
	case protoreflect.Sint64Kind:
		return protowire.EncodeZigZag(n), true
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		if n < 0 || n > math.MaxUint32 {
			return 0, false
		}
		return uint64(n), true
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if n < 0 {
			return 0, false
		}
		return uint64(n), true
	}
	return 0, false
}

// luaNumberText is the JSON text luaserial.ToJSON writes for a finite x
// (its number rule).
func luaNumberText(dst []byte, x float64) []byte {
	return luaserial.AppendJSONNumber(dst, x)
}
