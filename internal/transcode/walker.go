package transcode

import (
	"math"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The encoder walks a message's plan once for both of its inputs, proto3
// JSON text (Encode) and a Lua table in string.buffer's format
// (EncodeLua): the walk below (message, field, nested, list, map, scalar)
// decides what is written and in which order, and pulls values from its
// source through the small set of methods after it (openObject, nextKey,
// openList, nextItem, null, isString, text, intNumber, floatNumber,
// enumNumber, boolValue, skipUnknown, other, atEnd). Each of those reads
// the input in the encoder's format: the Lua table's tags itself, or
// through the string.buffer readers of fastlua.go; the JSON text through
// the scanner of fastencode.go.
//
// The source is a flag on the encoder, not a Go interface or a type
// parameter. A walker of this shape calling its source through an
// interface, or through a type parameter (Go compiles those calls
// through a dictionary, one body for all pointer types), has the source
// moved to the heap (go build -gcflags=-m: "escapes to heap"): one
// allocation per call where Encode makes none, and an indirect call for
// every read. With the flag the encoder stays on its caller's stack (0
// allocs/op) and a read costs a predictable branch, plus a call where
// the two encoders this walk replaced read inline. Measured against
// them, alternating in one process (the shared test machine's wall time
// varies by more from one run to the next), the walk cost EncodeProfile
// +7.5% and EncodeLuaProfile +8.4% per call: that is with nextKey, text,
// openObject, openList and the number readers reading both formats
// themselves rather than through one more call each, and short Lua
// strings read inline (luaShortString); through the extra calls it was
// +13% for Lua. text's ASCII shortcut and validUTF8 then won more than
// that back (-14% and -1% against the old encoders).
//
// The decoder (fastdecode.go) is the same walk the other way: it reads the
// wire data and pushes each value into its sink, JSON text or string.buffer
// bytes, chosen by its lua flag for the same reason.

// encode encodes a whole top-level value of type p.
func (e *fastEncoder) encode(out []byte, p *plan) ([]byte, bool) {
	if p.wkt != wktNone {
		return out, false
	}
	out, ok := e.message(out, p)
	if !ok {
		return out, false
	}
	return out, e.atEnd()
}

// message encodes the object at the read position as the fields of p,
// put in the order the Go encoder uses.
func (e *fastEncoder) message(out []byte, p *plan) ([]byte, bool) {
	if e.depth >= maxFastDepth || len(p.fields) > 64 || p.oneofs > 64 {
		return out, false
	}
	size, ok := e.openObject()
	if !ok {
		return out, false
	}
	e.depth++
	defer func() { e.depth-- }()
	base := len(out)
	var segStack [16]segment
	segs := segStack[:0]
	order := newFieldOrder()
	for i := 0; ; i++ {
		key, more, ok := e.nextKey(i, size)
		if !ok {
			return out, false
		}
		if !more {
			break
		}
		var f *fieldPlan
		if s := p.names.find(key); s != nil {
			f = s.f
		}
		if f == nil {
			if !e.skipUnknown(key) {
				return out, false
			}
			continue
		}
		if !order.claim(f) {
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

func (e *fastEncoder) field(out []byte, f *fieldPlan) ([]byte, bool) {
	switch {
	case e.null():
		return out, false // null: protojson's rules for it have exceptions
	case f.isMap:
		return e.mapField(out, f)
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
		out = out[:start] // proto3: a zero value is not written
	}
	return out, true
}

// nested appends a length-prefixed message of type p.
func (e *fastEncoder) nested(out []byte, p *plan) ([]byte, bool) {
	lenPos := len(out)
	out = append(out, 0)
	var ok bool
	switch p.wkt {
	case wktNone:
		out, ok = e.message(out, p)
	case wktTimestamp, wktDuration:
		var s []byte
		if s, ok = e.text(); ok {
			out, ok = appendTime(out, p, s)
		}
	case wktWrapper:
		f := p.byNumber(1)
		start := len(out)
		out = protowire.AppendTag(out, 1, wireType(f.kind))
		var zero bool
		out, zero, ok = e.scalar(out, f)
		if zero {
			out = out[:start]
		}
	default:
		out, ok = e.other(out, p.md)
	}
	if !ok {
		return out, false
	}
	return finishLen(out, lenPos), true
}

func (e *fastEncoder) listField(out []byte, f *fieldPlan) ([]byte, bool) {
	if e.depth >= maxFastDepth {
		return out, false
	}
	size, ok := e.openList()
	if !ok {
		return out, false
	}
	e.depth++
	defer func() { e.depth-- }()
	more, ok := e.nextItem(0, size)
	if !ok || !more {
		return out, ok
	}
	packed := f.packed
	lenPos := 0
	if packed {
		out = protowire.AppendTag(out, f.num, protowire.BytesType)
		lenPos = len(out)
		out = append(out, 0)
	}
	for i := 1; more; i++ {
		if e.null() {
			return out, false
		}
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
			return out, false
		}
		if more, ok = e.nextItem(i, size); !ok {
			return out, false
		}
	}
	if packed {
		out = finishLen(out, lenPos)
	}
	return out, true
}

type mapEntry struct {
	key        entry
	start, end int
}

// mapField encodes an object as map entries, in key order. The Lua form
// leaves maps to the JSON path: a Lua table with integer keys is not the
// object the JSON path would write.
func (e *fastEncoder) mapField(out []byte, f *fieldPlan) ([]byte, bool) {
	if e.lua || e.depth >= maxFastDepth {
		return out, false
	}
	size, ok := e.openObject()
	if !ok {
		return out, false
	}
	e.depth++
	defer func() { e.depth-- }()
	base := len(out)
	var entStack [8]mapEntry
	ents := entStack[:0]
	for i := 0; ; i++ {
		key, more, ok := e.nextKey(i, size)
		if !ok || (more && e.null()) {
			return out, false
		}
		if !more {
			break
		}
		start := len(out)
		out = protowire.AppendTag(out, f.num, protowire.BytesType)
		lenPos := len(out)
		out = append(out, 0)
		k, ok := parseMapKey(f.mapKey, key)
		if !ok {
			return out, false
		}
		out = appendKey(out, f.mapKey, k)
		if f.mapVal.kind == protoreflect.MessageKind {
			out = protowire.AppendTag(out, 2, protowire.BytesType)
			out, ok = e.nested(out, f.mapVal.msg)
		} else {
			out = protowire.AppendTag(out, 2, wireType(f.mapVal.kind))
			out, _, ok = e.scalar(out, f.mapVal)
		}
		if !ok {
			return out, false
		}
		out = finishLen(out, lenPos)
		ents = append(ents, mapEntry{key: k, start: start, end: len(out)})
	}
	return sortMapEntries(out, base, f.mapKey.kind, ents)
}

// scalar appends the value at the read position as kind f.kind (without
// tag) and tells whether it is the zero value.
func (e *fastEncoder) scalar(out []byte, f *fieldPlan) ([]byte, bool, bool) {
	switch f.kind {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		var v uint64
		var ok bool
		if e.isString() {
			var s []byte
			if s, ok = e.text(); ok && isPlainInt(s) {
				var en entry
				en, ok = intEntry(f.kind, string(s))
				v = en.v
			} else {
				ok = false
			}
		} else {
			v, ok = e.intNumber(f.kind)
		}
		if !ok {
			return out, false, false
		}
		return appendWire(out, f.kind, v), v == 0, true
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		var x float64
		var ok bool
		if e.isString() {
			var s []byte
			if s, ok = e.text(); ok {
				x, ok = nonFinite(s)
			}
		} else {
			x, ok = e.floatNumber(f.kind)
		}
		if !ok {
			return out, false, false
		}
		if f.kind == protoreflect.FloatKind {
			b := math.Float32bits(float32(x))
			return protowire.AppendFixed32(out, b), b == 0, true
		}
		b := math.Float64bits(x)
		return protowire.AppendFixed64(out, b), b == 0, true
	case protoreflect.BoolKind:
		v, ok := e.boolValue()
		if !ok {
			return out, false, false
		}
		if v {
			return append(out, 1), false, true
		}
		return append(out, 0), true, true
	case protoreflect.StringKind:
		s, ok := e.text()
		if !ok {
			return out, false, false
		}
		return protowire.AppendBytes(out, s), len(s) == 0, true
	case protoreflect.BytesKind:
		s, ok := e.text()
		if !ok {
			return out, false, false
		}
		return appendBase64(out, s)
	case protoreflect.EnumKind:
		if f.nullValue {
			return out, false, false
		}
		var n int64
		if e.isString() {
			s, ok := e.text()
			if !ok {
				return out, false, false
			}
			ev := f.enumByName.find(s)
			if ev == nil {
				return out, false, false
			}
			n = int64(ev.v)
		} else {
			var ok bool
			if n, ok = e.enumNumber(); !ok {
				return out, false, false
			}
		}
		return protowire.AppendVarint(out, uint64(n)), n == 0, true
	}
	return out, false, false
}

// nonFinite reads the strings protojson writes for NaN and the infinities.
func nonFinite(s []byte) (float64, bool) {
	switch string(s) {
	case "NaN":
		return math.NaN(), true
	case "Infinity":
		return math.Inf(1), true
	case "-Infinity":
		return math.Inf(-1), true
	}
	return 0, false
}

// The source: what the walk above reads, in the encoder's input format.

// openObject enters an object (a message's fields, a map's entries) and
// returns what nextKey needs to know of it.
// In the Lua table, the JSON path writes a table whose keys are all
// strings as an object; any other key, or an array part, is left to it.
// size is the number of keys.
func (e *fastEncoder) openObject() (size int, ok bool) {
	if !e.lua {
		return 0, e.consume('{')
	}
	switch e.luaTag() {
	case luaTab:
		e.pos++
		return 0, true
	case luaHash:
		e.pos++
		h, ok := e.luaU124()
		return h, ok && h <= len(e.in)-e.pos
	}
	return 0, false
}

// nextKey reads the key of the object's entry i (from 0), or reports the
// end of the object with more == false. (Both formats' cases are here, not
// behind one more call: it runs for every field.)
func (e *fastEncoder) nextKey(i, size int) (key []byte, more, ok bool) {
	if e.lua {
		if i == size {
			return nil, false, true
		}
		if key, ok = e.luaShortString(); !ok {
			key, ok = e.luaString()
		}
		ok = ok && validUTF8(key)
		return key, ok, ok
	}
	if more, ok = e.jsonNext('}', i == 0); !more || !ok {
		return nil, false, ok
	}
	if key, ok = e.text(); !ok || !e.consume(':') {
		return nil, false, false
	}
	return key, true, true
}

// openList enters a list and returns what nextItem needs to know of it.
// In the Lua table it takes what the JSON path writes as a non-empty
// array from a plain list (1..n, no holes), or as [] from an
// array-marked empty table; a hole (nil) among the values fails to read
// as one (the JSON path writes an object). size is the number of values.
func (e *fastEncoder) openList() (size int, ok bool) {
	if !e.lua {
		return 0, e.consume('[')
	}
	switch e.luaTag() {
	case luaTabMT:
		e.pos++
		if _, ok := e.luaU124(); !ok || e.luaTag() != luaTab {
			return 0, false
		}
		e.pos++
		return 0, true
	case luaArray1:
		e.pos++
		a, ok := e.luaU124()
		return a - 1, ok && a >= 2 && a-1 <= len(e.in)-e.pos
	}
	return 0, false
}

// nextItem tells whether the list has an item i (from 0), the next to
// read, or has ended.
func (e *fastEncoder) nextItem(i, size int) (more, ok bool) {
	if e.lua {
		return i < size, true
	}
	return e.jsonNext(']', i == 0)
}

// null tells whether the value at the read position is a JSON null.
func (e *fastEncoder) null() bool { return !e.lua && e.peek() == 'n' }

// isString tells whether the value at the read position is a string.
func (e *fastEncoder) isString() bool {
	if e.lua {
		return e.luaTag() >= luaStr
	}
	return e.peek() == '"'
}

// intNumber reads a number as an integer of kind k, in wire form: in the
// JSON text plain digits only, in the Lua table an integer the JSON text
// would write as such.
func (e *fastEncoder) intNumber(k protoreflect.Kind) (uint64, bool) {
	if e.lua {
		x, ok := e.luaNumber()
		if !ok {
			return 0, false
		}
		n, ok := luaInt(x)
		if !ok {
			return 0, false
		}
		return intWire(k, n)
	}
	tok, ok := e.number()
	if !ok || !isPlainInt(tok) {
		return 0, false
	}
	en, ok := intEntry(k, string(tok))
	return en.v, ok
}

// floatNumber reads a number as a float or double field's value: in the
// Lua table, the value the JSON path reads back from the text the Lua
// module writes.
func (e *fastEncoder) floatNumber(k protoreflect.Kind) (float64, bool) {
	if e.lua {
		x, ok := e.luaNumber()
		switch {
		case !ok:
			return 0, false
		case math.IsNaN(x):
			return math.NaN(), true // "NaN" in JSON, read back as Go's NaN
		case k == protoreflect.FloatKind && !math.IsInf(x, 0) && x != 0:
			return luaFloat32(x)
		}
		return x, true
	}
	tok, ok := e.number()
	if !ok {
		return 0, false
	}
	bitSize := 64
	if k == protoreflect.FloatKind {
		bitSize = 32
	}
	return parseFloat(tok, bitSize)
}

// enumNumber reads a number as an enum value.
func (e *fastEncoder) enumNumber() (int64, bool) {
	if e.lua {
		x, ok := e.luaNumber()
		if !ok {
			return 0, false
		}
		n, ok := luaInt(x)
		return n, ok && n >= math.MinInt32 && n <= math.MaxInt32
	}
	tok, ok := e.number()
	if !ok || !isPlainInt(tok) {
		return 0, false
	}
	n, err := strconv.ParseInt(string(tok), 10, 32)
	return n, err == nil
}

// boolValue reads true or false.
func (e *fastEncoder) boolValue() (v, ok bool) {
	if e.lua {
		return e.luaBool()
	}
	if e.lit("true") {
		return true, true
	}
	return false, e.lit("false")
}

// skipUnknown passes over the value of a key the message does not have,
// or reports false to leave the call to protojson.
func (e *fastEncoder) skipUnknown(key []byte) bool {
	return !e.lua && e.discard && (len(key) == 0 || key[0] != '[') && e.skip(e.depth)
}

// other encodes a value of a type the walk leaves to protojson (Struct,
// Any, ...), or reports false.
func (e *fastEncoder) other(out []byte, md protoreflect.MessageDescriptor) ([]byte, bool) {
	if e.lua {
		return out, false
	}
	if md.FullName() == fieldMaskName && e.peek() == '{' {
		return e.fieldMaskObject(out)
	}
	return e.viaProtojson(out, md)
}

// atEnd tells whether the whole input has been read.
func (e *fastEncoder) atEnd() bool {
	if !e.lua {
		e.ws()
	}
	return e.pos == len(e.in)
}
