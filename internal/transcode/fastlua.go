package transcode

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
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
	if m.plan.wkt != wktNone {
		return dst, false
	}
	le := luaEncoder{in: ser}
	out, ok := le.message(dst, m.plan)
	if !ok || le.pos != len(ser) {
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

type luaEncoder struct {
	in    []byte
	pos   int
	depth int
}

func (e *luaEncoder) tag() byte {
	if e.pos < len(e.in) {
		return e.in[e.pos]
	}
	return 0
}

func (e *luaEncoder) u124() (int, bool) {
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

// str reads a string (its tag included); ok is false for another value.
func (e *luaEncoder) str() ([]byte, bool) {
	if e.tag() < luaStr {
		return nil, false
	}
	v, ok := e.u124()
	n := v - luaStr
	if !ok || n < 0 || n > len(e.in)-e.pos {
		return nil, false
	}
	s := e.in[e.pos : e.pos+n]
	e.pos += n
	return s, true
}

// num reads a number.
func (e *luaEncoder) num() (float64, bool) {
	if e.tag() != luaNum || e.pos+9 > len(e.in) {
		return 0, false
	}
	x := math.Float64frombits(binary.LittleEndian.Uint64(e.in[e.pos+1:]))
	e.pos += 9
	return x, true
}

// message encodes the table at pos as the fields of p. The JSON path
// writes a table whose keys are all strings as an object; any other key,
// or an array part, is left to it.
func (e *luaEncoder) message(out []byte, p *plan) ([]byte, bool) {
	if e.depth >= maxFastDepth || len(p.fields) > 64 || p.oneofs > 64 {
		return out, false
	}
	var h int
	switch e.tag() {
	case luaTab:
		e.pos++
		return out, true
	case luaHash:
		e.pos++
		var ok bool
		if h, ok = e.u124(); !ok || h > len(e.in)-e.pos {
			return out, false
		}
	default:
		return out, false
	}
	e.depth++
	defer func() { e.depth-- }()
	base := len(out)
	var segStack [16]segment
	segs := segStack[:0]
	order := newFieldOrder()
	for i := 0; i < h; i++ {
		key, ok := e.str()
		if !ok || !utf8.Valid(key) {
			return out, false
		}
		var f *fieldPlan
		if s := p.names.find(key); s != nil {
			f = s.f
		}
		if f == nil || !order.claim(f) {
			return out, false
		}
		start := len(out)
		if out, ok = e.field(out, f); !ok {
			return out, false
		}
		segs = order.wrote(segs, f, start, len(out))
	}
	return order.finish(out, base, segs), true
}

func (e *luaEncoder) field(out []byte, f *fieldPlan) ([]byte, bool) {
	switch {
	case f.isMap:
		return out, false
	case f.list:
		return e.listField(out, f)
	case f.kind == protoreflect.MessageKind:
		out = protowire.AppendTag(out, f.num, protowire.BytesType)
		return e.nested(out, f.msg)
	}
	start := len(out)
	out = protowire.AppendTag(out, f.num, wireType(f.kind))
	out, zero, ok := e.scalar(out, f)
	if !ok {
		return out, false
	}
	if zero && !f.presence {
		out = out[:start]
	}
	return out, true
}

func (e *luaEncoder) nested(out []byte, p *plan) ([]byte, bool) {
	lenPos := len(out)
	out = append(out, 0)
	var ok bool
	switch p.wkt {
	case wktNone:
		out, ok = e.message(out, p)
	case wktTimestamp, wktDuration:
		s, isStr := e.str()
		if !isStr || !utf8.Valid(s) {
			return out, false
		}
		out, ok = appendTime(out, p, string(s))
	case wktWrapper:
		f := p.byNumber(1)
		start := len(out)
		out = protowire.AppendTag(out, 1, wireType(f.kind))
		var zero bool
		out, zero, ok = e.scalar(out, f)
		if zero {
			out = out[:start]
		}
	}
	if !ok {
		return out, false
	}
	return finishLen(out, lenPos), true
}

// listField takes what the JSON path writes as a non-empty array from a
// plain list (1..n, no holes), or as [] from an array-marked empty table.
func (e *luaEncoder) listField(out []byte, f *fieldPlan) ([]byte, bool) {
	switch e.tag() {
	case luaTabMT:
		e.pos++
		if _, ok := e.u124(); !ok || e.tag() != luaTab {
			return out, false
		}
		e.pos++
		return out, true
	case luaArray1:
	default:
		return out, false
	}
	e.pos++
	a, ok := e.u124()
	if !ok || a < 2 || a-1 > len(e.in)-e.pos {
		return out, false
	}
	packed := f.packed
	lenPos := 0
	if packed {
		out = protowire.AppendTag(out, f.num, protowire.BytesType)
		lenPos = len(out)
		out = append(out, 0)
	}
	for i := 1; i < a; i++ {
		switch {
		case packed:
			out, _, ok = e.scalar(out, f)
		case f.kind == protoreflect.MessageKind:
			out = protowire.AppendTag(out, f.num, protowire.BytesType)
			out, ok = e.nested(out, f.msg)
		default:
			out = protowire.AppendTag(out, f.num, wireType(f.kind))
			out, _, ok = e.scalar(out, f)
		}
		if !ok {
			// a hole (nil) among them too: the JSON path writes an object
			return out, false
		}
	}
	if packed {
		out = finishLen(out, lenPos)
	}
	return out, true
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

// scalar appends the value at pos as kind f.kind (without tag) and tells
// whether it is the zero value, as fastEncoder.scalar does for the JSON
// text the Lua module would have written.
func (e *luaEncoder) scalar(out []byte, f *fieldPlan) ([]byte, bool, bool) {
	t := e.tag()
	switch f.kind {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		var v uint64
		if t == luaNum {
			x, _ := e.num()
			n, ok := luaInt(x)
			if !ok {
				return out, false, false
			}
			if v, ok = intWire(f.kind, n); !ok {
				return out, false, false
			}
		} else {
			s, ok := e.str()
			if !ok || !isPlainInt(s) {
				return out, false, false
			}
			en, ok := intEntry(f.kind, string(s))
			if !ok {
				return out, false, false
			}
			v = en.v
		}
		return appendWire(out, f.kind, v), v == 0, true
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		var x float64
		if t == luaNum {
			x, _ = e.num()
			switch {
			case math.IsNaN(x):
				x = math.NaN() // "NaN" in JSON, read back as Go's NaN
			case f.kind == protoreflect.FloatKind && !math.IsInf(x, 0) && x != 0:
				// the JSON text rounded to float32, as the JSON path does:
				// rounding x itself could differ (double rounding)
				var buf [32]byte
				y, err := strconv.ParseFloat(string(luaNumberText(buf[:0], x)), 32)
				if err != nil {
					return out, false, false
				}
				x = y
			}
		} else {
			s, ok := e.str()
			if !ok {
				return out, false, false
			}
			switch string(s) {
			case "NaN":
				x = math.NaN()
			case "Infinity":
				x = math.Inf(1)
			case "-Infinity":
				x = math.Inf(-1)
			default:
				return out, false, false
			}
		}
		if f.kind == protoreflect.FloatKind {
			b := math.Float32bits(float32(x))
			return protowire.AppendFixed32(out, b), b == 0, true
		}
		b := math.Float64bits(x)
		return protowire.AppendFixed64(out, b), b == 0, true
	case protoreflect.BoolKind:
		switch t {
		case luaTrue:
			e.pos++
			return append(out, 1), false, true
		case luaFalse:
			e.pos++
			return append(out, 0), true, true
		}
		return out, false, false
	case protoreflect.StringKind:
		s, ok := e.str()
		if !ok || !utf8.Valid(s) {
			return out, false, false
		}
		return protowire.AppendBytes(out, s), len(s) == 0, true
	case protoreflect.BytesKind:
		s, ok := e.str()
		if !ok || !utf8.Valid(s) {
			return out, false, false
		}
		return appendBase64(out, s)
	case protoreflect.EnumKind:
		if f.nullValue {
			return out, false, false
		}
		if t == luaNum {
			x, _ := e.num()
			n, ok := luaInt(x)
			if !ok || n < math.MinInt32 || n > math.MaxInt32 {
				return out, false, false
			}
			return protowire.AppendVarint(out, uint64(n)), n == 0, true
		}
		s, ok := e.str()
		if !ok || !utf8.Valid(s) {
			return out, false, false
		}
		ev := f.enumByName.find(s)
		if ev == nil {
			return out, false, false
		}
		v := uint64(int64(ev.v))
		return protowire.AppendVarint(out, v), v == 0, true
	}
	return out, false, false
}

// luaNumberText is the JSON text the Lua module writes for a finite x
// that is not an integer below 1e15 (json.lua's put_number, luaserial's
// appendNumber): the shorter of %.15g and %.17g that reads back as x.
func luaNumberText(dst []byte, x float64) []byte {
	if n, ok := luaInt(x); ok {
		return strconv.AppendInt(dst, n, 10)
	}
	out := strconv.AppendFloat(dst, x, 'g', 15, 64)
	if back, err := strconv.ParseFloat(string(out), 64); err != nil || back != x {
		out = strconv.AppendFloat(dst[:0], x, 'g', 17, 64)
	}
	return out
}

// appendBase64 is fastEncoder.scalar's bytes case.
func appendBase64(out, s []byte) ([]byte, bool, bool) {
	enc := base64.StdEncoding
	if strings.ContainsAny(string(s), "-_") {
		enc = base64.URLEncoding
	}
	if len(s)%4 != 0 {
		enc = enc.WithPadding(base64.NoPadding)
	}
	n := enc.DecodedLen(len(s))
	out = protowire.AppendVarint(out, uint64(n))
	lenPos := len(out) - protowire.SizeVarint(uint64(n))
	dataPos := len(out)
	out = slices.Grow(out, n)[:dataPos+n]
	m, err := enc.Decode(out[dataPos:], s)
	if err != nil {
		return out, false, false
	}
	out = out[:dataPos+m]
	if m != n {
		out = finishLenAt(out, lenPos, dataPos)
	}
	return out, m == 0, true
}

// appendTime is fastEncoder.timeValue for the string s.
func appendTime(out []byte, p *plan, s string) ([]byte, bool) {
	var secs int64
	var nanos int32
	var ok bool
	if p.wkt == wktTimestamp {
		secs, nanos, ok = parseTimestamp(s)
	} else {
		secs, nanos, ok = parseDuration(s)
	}
	if !ok {
		return out, false
	}
	if secs != 0 {
		out = protowire.AppendTag(out, 1, protowire.VarintType)
		out = protowire.AppendVarint(out, uint64(secs))
	}
	if nanos != 0 {
		out = protowire.AppendTag(out, 2, protowire.VarintType)
		out = protowire.AppendVarint(out, uint64(int64(nanos)))
	}
	return out, true
}
