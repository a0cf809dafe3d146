package transcode

import (
	"cmp"
	"encoding/base64"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

// fastDecoder writes the proto3 JSON form of wire data straight from the
// bytes. ok == false means "let protojson do it": malformed input, or
// input this decoder does not handle; protojson then gives the answer or
// the error.
type fastDecoder struct {
	reg        *Registry
	protoNames bool
	// emit: every field outside a oneof is written, unpopulated ones with
	// their zero value (null for a singular message), as protojson's
	// EmitUnpopulated does. JSON text only (lua gives up on it).
	emit bool
	// lua: write the value in LuaJIT's string.buffer format, the bytes
	// luaserial.FromJSON writes for the JSON text (see DecodeLua), instead
	// of the text.
	lua   bool
	depth int // lua: tables open around the value being written
}

// luaMaxDepth is where the Lua form gives up and leaves the call to the
// JSON text and luaserial.FromJSON, which know the exact limit: a message
// nests a list or a map, which nests messages, so one level of protobuf
// can be two of tables.
const luaMaxDepth = luaserial.MaxDepth - 4

// entry is one field occurrence in a message's wire data.
type entry struct {
	f   *fieldPlan
	wt  protowire.Type
	v   uint64 // varint and fixed values
	b   []byte // length-delimited values
	pos int    // order of appearance
}

func (d *fastDecoder) message(out []byte, p *plan, b []byte) ([]byte, bool) {
	switch p.wkt {
	case wktTimestamp, wktDuration:
		return d.timeValue(out, p, b)
	case wktWrapper:
		return d.wrapper(out, p, b)
	case wktOther:
		return d.viaProtojson(out, p.md, b)
	}
	if d.lua && (d.emit || p.dupLuaKey(d.protoNames) || d.depth >= luaMaxDepth) {
		return out, false
	}
	var stack [24]entry
	es := stack[:0]
	var lastOneof [8]int // entry pos of the winning member, per oneof
	if p.oneofs > len(lastOneof) {
		return out, false
	}
	for pos := 0; len(b) > 0; pos++ {
		num, wt, val, n := nextField(b)
		if n < 0 {
			return out, false
		}
		b = b[n:]
		f := p.byNumber(num)
		if f == nil {
			continue // unknown: protojson leaves it out too
		}
		e := entry{f: f, wt: wt, pos: pos}
		want := wireType(f.kind)
		if f.isMap {
			want = protowire.BytesType
		}
		switch {
		case wt == want:
		case wt == protowire.BytesType && f.list && want != protowire.BytesType:
			// packed
		default:
			continue // wrong wire type: an unknown field, as the generated code sees it
		}
		e.v, e.b = fieldValue(wt, val)
		// Every occurrence must be valid UTF-8, also one a later one
		// overwrites: the generated code checks each as it reads it.
		if f.kind == protoreflect.StringKind && !f.isMap && !utf8.Valid(e.b) {
			return out, false
		}
		if f.oneof >= 0 {
			lastOneof[f.oneof] = pos + 1
		}
		es = append(es, e)
	}
	// protojson writes fields in declaration order; the wire has them in
	// any order.
	if !slices.IsSortedFunc(es, func(a, b entry) int { return a.f.idx - b.f.idx }) {
		slices.SortStableFunc(es, func(a, b entry) int { return a.f.idx - b.f.idx })
	}

	out, table := d.open(out, '{')
	written := 0
	var ok bool
	if d.emit {
		return d.emitAll(out, p, es, lastOneof[:], table)
	}
	for i := 0; i < len(es); {
		f := es[i].f
		j := i + 1
		for j < len(es) && es[j].f == f {
			j++
		}
		group := es[i:j]
		i = j
		var wrote bool
		out, wrote, ok = d.group(out, f, group, lastOneof[:], written)
		if !ok {
			return out, false
		}
		if wrote {
			written++
		}
	}
	return d.close(out, table, written, '}')
}

// group writes the key and value of field f, whose occurrences on the
// wire are group, after written fields; wrote is false when it writes
// nothing (a oneof member another one overrode, a zero scalar without
// presence, an empty list or map), ok false to give up.
func (d *fastDecoder) group(out []byte, f *fieldPlan, group []entry, lastOneof []int, written int) (_ []byte, wrote, ok bool) {
	if f.oneof >= 0 {
		// Only the member set last counts; a message member set
		// twice would be merged, which protojson does for us.
		win := lastOneof[f.oneof] - 1
		last := -1
		n := 0
		for k := range group {
			if group[k].pos > last {
				last = group[k].pos
			}
			n++
		}
		if last != win {
			return out, false, true
		}
		if f.kind == protoreflect.MessageKind && n > 1 {
			return out, false, false
		}
	}
	start := len(out)
	out = d.fieldKey(d.sep(out, written), f)
	switch {
	case f.isMap:
		out, wrote, ok = d.mapValue(out, f, group)
	case f.list:
		out, wrote, ok = d.list(out, f, group)
	case f.kind == protoreflect.MessageKind:
		if len(group) > 1 {
			return out, false, false
		}
		out, ok = d.message(out, f.msg, group[0].b)
		wrote = true
	default:
		e := group[len(group)-1] // the last one wins
		if !f.presence && !d.emit && isZeroScalar(f.kind, e) {
			return out[:start], false, true
		}
		out, ok = d.scalar(out, f, e)
		wrote = true
	}
	if !ok {
		return out, false, false
	}
	if !wrote {
		if !d.emit {
			return out[:start], false, true
		}
		// an empty list or map: written as such
		out = d.fieldKey(d.sep(out[:start], written), f)
		if f.isMap {
			out = append(out, "{}"...)
		} else {
			out = append(out, "[]"...)
		}
	}
	return out, true, true
}

// emitAll is message's write for emit: the fields in declaration order,
// each one present (group) or not (its zero value), oneof members only
// when set.
func (d *fastDecoder) emitAll(out []byte, p *plan, es []entry, lastOneof []int, table int) ([]byte, bool) {
	written, i := 0, 0
	for _, f := range p.fields {
		j := i
		for j < len(es) && es[j].f == f {
			j++
		}
		if j > i {
			var wrote, ok bool
			out, wrote, ok = d.group(out, f, es[i:j], lastOneof, written)
			i = j
			if !ok {
				return out, false
			}
			if wrote {
				written++
			}
			continue
		}
		fd := f.fd
		if fd.ContainingOneof() != nil {
			continue // unset oneof members (and proto3 optional) stay out
		}
		out = d.fieldKey(d.sep(out, written), f)
		switch {
		case f.isMap:
			out = append(out, "{}"...)
		case f.list:
			out = append(out, "[]"...)
		case f.kind == protoreflect.MessageKind || f.kind == protoreflect.GroupKind,
			fd.Syntax() == protoreflect.Proto2 && fd.Default().IsValid():
			out = append(out, "null"...)
		default:
			var ok bool
			if out, ok = d.scalar(out, f, entry{f: f}); !ok {
				return out, false
			}
		}
		written++
	}
	return d.close(out, table, written, '}')
}

// The sink: what the walk writes through, in the decoder's output format
// (JSON text, or with lua string.buffer bytes): open and close, sep,
// fieldKey and mapKeyText, scalar, timeValue, viaProtojson.

// open starts an object or array: JSON's bracket, or a Lua table whose
// header close writes at the returned offset once the size is known.
func (d *fastDecoder) open(out []byte, bracket byte) ([]byte, int) {
	if d.lua {
		d.depth++
		return luaserial.OpenTable(out)
	}
	return append(out, bracket), 0
}

// close ends what open started, now holding n keys or values.
func (d *fastDecoder) close(out []byte, table, n int, bracket byte) ([]byte, bool) {
	switch {
	case !d.lua:
		return append(out, bracket), true
	case bracket == ']':
		d.depth--
		return luaserial.CloseArray(out, table, n)
	}
	d.depth--
	return luaserial.CloseHash(out, table, n)
}

// sep writes what goes before the value (or key and value) n, from 0, of
// an array or object.
func (d *fastDecoder) sep(out []byte, n int) []byte {
	if n > 0 && !d.lua {
		return append(out, ',')
	}
	return out
}

// fieldKey writes the key of field f (in JSON, with its ':').
func (d *fastDecoder) fieldKey(out []byte, f *fieldPlan) []byte {
	switch {
	case d.lua && d.protoNames:
		return append(out, f.luaProtoKey...)
	case d.lua:
		return append(out, f.luaCamelKey...)
	case d.protoNames:
		return append(out, f.protoKey...)
	}
	return append(out, f.camelKey...)
}

// mapKeyText is a map key as fieldKey writes a field's: s is the key's
// text, valid UTF-8 (a string key's bytes, or "12", "true").
func (d *fastDecoder) mapKeyText(s []byte) []byte {
	if d.lua {
		return luaserial.AppendString(nil, s)
	}
	out, _ := appendJSONString(make([]byte, 0, len(s)+3), s) // "s":
	return append(out, ':')
}

func isZeroScalar(k protoreflect.Kind, e entry) bool {
	switch k {
	case protoreflect.StringKind, protoreflect.BytesKind:
		return len(e.b) == 0
	case protoreflect.FloatKind, protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int32Kind, protoreflect.Uint32Kind, protoreflect.EnumKind:
		// 32-bit values: the generated code keeps the low 32 bits of a
		// longer varint.
		return uint32(e.v) == 0
	case protoreflect.Sint32Kind:
		return signedValue(k, e.v) == 0
	}
	return e.v == 0
}

func (d *fastDecoder) list(out []byte, f *fieldPlan, group []entry) ([]byte, bool, bool) {
	out, table := d.open(out, '[')
	n := 0
	var ok bool
	one := func(e entry) {
		out = d.sep(out, n)
		n++
		if f.kind == protoreflect.MessageKind {
			out, ok = d.message(out, f.msg, e.b)
		} else {
			out, ok = d.scalar(out, f, e)
		}
	}
	for _, e := range group {
		if e.wt == protowire.BytesType && wireType(f.kind) != protowire.BytesType {
			// packed: a run of values without tags
			b := e.b
			for len(b) > 0 {
				var m int
				v := entry{wt: wireType(f.kind)}
				switch v.wt {
				case protowire.VarintType:
					v.v, m = protowire.ConsumeVarint(b)
				case protowire.Fixed32Type:
					var x uint32
					x, m = protowire.ConsumeFixed32(b)
					v.v = uint64(x)
				case protowire.Fixed64Type:
					v.v, m = protowire.ConsumeFixed64(b)
				}
				if m < 0 {
					return out, false, false
				}
				b = b[m:]
				if one(v); !ok {
					return out, false, false
				}
			}
			continue
		}
		if one(e); !ok {
			return out, false, false
		}
	}
	if n == 0 {
		return out, false, true
	}
	out, ok = d.close(out, table, n, ']')
	return out, true, ok
}

type mapItem struct {
	key     entry
	val     entry
	hasVal  bool
	keyText []byte // the key as the sink writes it (mapKeyText)
}

func (d *fastDecoder) mapValue(out []byte, f *fieldPlan, group []entry) ([]byte, bool, bool) {
	items := make([]mapItem, 0, len(group))
	for _, g := range group {
		it := mapItem{key: entry{wt: wireType(f.mapKey.kind)}, val: entry{wt: wireType(f.mapVal.kind)}}
		b := g.b
		vals := 0
		for len(b) > 0 {
			num, wt, val, n := nextField(b)
			if n < 0 {
				return out, false, false
			}
			b = b[n:]
			var target *entry
			var fp *fieldPlan
			switch num {
			case 1:
				target, fp = &it.key, f.mapKey
			case 2:
				target, fp = &it.val, f.mapVal
			default:
				continue
			}
			if wt != wireType(fp.kind) {
				continue
			}
			target.v, target.b = fieldValue(wt, val)
			if fp.kind == protoreflect.StringKind && !utf8.Valid(target.b) {
				return out, false, false // as above: each occurrence counts
			}
			if num == 2 {
				it.hasVal = true
				vals++
			}
		}
		if vals > 1 && f.mapVal.kind == protoreflect.MessageKind {
			return out, false, false // merged: protojson's job
		}
		text := it.key.b
		if f.mapKey.kind != protoreflect.StringKind {
			// JSON keys are strings: "12", "true"
			var ok bool
			if text, ok = d.jsonScalar(nil, f.mapKey, it.key); !ok {
				return out, false, false
			}
			if len(text) > 0 && text[0] == '"' {
				text = text[1 : len(text)-1]
			}
		} else if !utf8.Valid(text) {
			return out, false, false
		}
		it.keyText = d.mapKeyText(text)
		items = append(items, it)
	}
	// The last entry for a key wins; protojson writes keys in order.
	slices.SortStableFunc(items, func(a, b mapItem) int { return compareMapKeys(f.mapKey.kind, a.key, b.key) })
	out, table := d.open(out, '{')
	n := 0
	for i, it := range items {
		if i+1 < len(items) && compareMapKeys(f.mapKey.kind, it.key, items[i+1].key) == 0 {
			continue
		}
		out = d.sep(out, n)
		n++
		out = append(out, it.keyText...)
		var ok bool
		switch {
		case f.mapVal.kind == protoreflect.MessageKind:
			out, ok = d.message(out, f.mapVal.msg, it.val.b)
		default:
			out, ok = d.scalar(out, f.mapVal, it.val)
		}
		if !ok {
			return out, false, false
		}
	}
	if n == 0 {
		return out, false, true
	}
	out, ok := d.close(out, table, n, '}')
	return out, true, ok
}

func compareMapKeys(k protoreflect.Kind, a, b entry) int {
	switch k {
	case protoreflect.StringKind:
		return bytesCompare(a.b, b.b)
	case protoreflect.BoolKind:
		return cmp.Compare(boolU(a.v), boolU(b.v))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return cmp.Compare(signedValue(k, a.v), signedValue(k, b.v))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return cmp.Compare(uint32(a.v), uint32(b.v))
	}
	return cmp.Compare(a.v, b.v)
}

func boolU(v uint64) uint64 {
	if v != 0 {
		return 1
	}
	return 0
}

func bytesCompare(a, b []byte) int {
	return slices.Compare(a, b)
}

// signedValue is the value of a signed integer field as the generated code
// reads it from the wire.
func signedValue(k protoreflect.Kind, v uint64) int64 {
	switch k {
	case protoreflect.Int32Kind, protoreflect.EnumKind:
		return int64(int32(v))
	case protoreflect.Sint32Kind:
		return int64(int32(protowire.DecodeZigZag(v & math.MaxUint32)))
	case protoreflect.Sfixed32Kind:
		return int64(int32(uint32(v)))
	case protoreflect.Sint64Kind:
		return protowire.DecodeZigZag(v)
	}
	return int64(v) // int64, sfixed64
}

// scalar appends one scalar or enum value.
func (d *fastDecoder) scalar(out []byte, f *fieldPlan, e entry) ([]byte, bool) {
	if d.lua {
		return d.luaScalar(out, f, e)
	}
	return d.jsonScalar(out, f, e)
}

// jsonScalar appends the JSON form of one scalar or enum value.
func (d *fastDecoder) jsonScalar(out []byte, f *fieldPlan, e entry) ([]byte, bool) {
	switch f.kind {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return strconv.AppendInt(out, signedValue(f.kind, e.v), 10), true
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		out = append(out, '"')
		out = strconv.AppendInt(out, signedValue(f.kind, e.v), 10)
		return append(out, '"'), true
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return strconv.AppendUint(out, uint64(uint32(e.v)), 10), true
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		out = append(out, '"')
		out = strconv.AppendUint(out, e.v, 10)
		return append(out, '"'), true
	case protoreflect.BoolKind:
		if e.v != 0 {
			return append(out, "true"...), true
		}
		return append(out, "false"...), true
	case protoreflect.FloatKind:
		return appendFloat(out, float64(math.Float32frombits(uint32(e.v))), 32), true
	case protoreflect.DoubleKind:
		return appendFloat(out, math.Float64frombits(e.v), 64), true
	case protoreflect.StringKind:
		if !utf8.Valid(e.b) {
			return out, false
		}
		return appendJSONString(out, e.b)
	case protoreflect.BytesKind:
		out = append(out, '"')
		out = base64.StdEncoding.AppendEncode(out, e.b)
		return append(out, '"'), true
	case protoreflect.EnumKind:
		if f.nullValue {
			return append(out, "null"...), true
		}
		n := protoreflect.EnumNumber(int32(e.v))
		if uint64(n) < uint64(len(f.enumByNum)) && f.enumByNum[n] != "" {
			out = append(out, '"')
			out = append(out, f.enumByNum[n]...)
			return append(out, '"'), true
		}
		if f.enumByNum != nil {
			return strconv.AppendInt(out, int64(n), 10), true
		}
		if ev := f.fd.Enum().Values().ByNumber(n); ev != nil {
			out = append(out, '"')
			out = append(out, ev.Name()...)
			return append(out, '"'), true
		}
		return strconv.AppendInt(out, int64(n), 10), true
	}
	return out, false
}

// appendFloat writes a float as protojson does.
func appendFloat(out []byte, n float64, bitSize int) []byte {
	switch {
	case math.IsNaN(n):
		return append(out, `"NaN"`...)
	case math.IsInf(n, 1):
		return append(out, `"Infinity"`...)
	case math.IsInf(n, -1):
		return append(out, `"-Infinity"`...)
	}
	format := byte('f')
	if abs := math.Abs(n); abs != 0 {
		if bitSize == 64 && (abs < 1e-6 || abs >= 1e21) ||
			bitSize == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	out = strconv.AppendFloat(out, n, format, -1, bitSize)
	if format == 'e' {
		// e-09 -> e-9, as encoding/json and protojson write it
		n := len(out)
		if n >= 4 && out[n-4] == 'e' && out[n-3] == '-' && out[n-2] == '0' {
			out[n-2] = out[n-1]
			out = out[:n-1]
		}
	}
	return out
}

// appendJSONString quotes valid UTF-8 as protojson does.
func appendJSONString(out, s []byte) ([]byte, bool) {
	out = append(out, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= ' ' && c != '"' && c != '\\' {
			if c < utf8.RuneSelf {
				out = append(out, c)
				i++
				continue
			}
			r, n := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && n == 1 {
				return out, false
			}
			out = append(out, s[i:i+n]...)
			i += n
			continue
		}
		out = append(out, '\\')
		if l := escapeLetter[c]; l != 0 {
			out = append(out, l)
		} else {
			out = append(out, 'u')
			out = append(out, "0000"[1+(bits.Len32(uint32(c))-1)/4:]...)
			out = strconv.AppendUint(out, uint64(c), 16)
		}
		i++
	}
	return append(out, '"'), true
}

// jsonEscapes pairs each character a JSON string writes as a backslash and
// a letter with that letter.
const jsonEscapes = "\"\"\\\\\bb\ff\nn\rr\tt"

// escapeLetter and unescapeLetter are jsonEscapes as tables, one each way
// (a "\/" reads as "/" too).
var escapeLetter, unescapeLetter = jsonEscapeTables()

func jsonEscapeTables() (esc, unesc [256]byte) {
	for i := 0; i < len(jsonEscapes); i += 2 {
		esc[jsonEscapes[i]] = jsonEscapes[i+1]
		unesc[jsonEscapes[i+1]] = jsonEscapes[i]
	}
	unesc['/'] = '/'
	return esc, unesc
}

// Limits of protojson's Timestamp and Duration.
const (
	minTimestampSeconds = -62135596800 // 0001-01-01T00:00:00Z
	maxTimestampSeconds = 253402300799 // 9999-12-31T23:59:59Z
	maxDurationSeconds  = 315576000000
	maxNanos            = 999999999
)

func (d *fastDecoder) timeValue(out []byte, p *plan, b []byte) ([]byte, bool) {
	if d.lua {
		var tmp [48]byte
		js, ok := d.jsonTimeValue(tmp[:0], p, b)
		if !ok {
			return out, false
		}
		return luaserial.AppendString(out, js[1:len(js)-1]), true // no escapes in it
	}
	return d.jsonTimeValue(out, p, b)
}

// jsonTimeValue writes a Timestamp or Duration as a JSON string.
func (d *fastDecoder) jsonTimeValue(out []byte, p *plan, b []byte) ([]byte, bool) {
	var secs, nanos int64
	for len(b) > 0 {
		num, wt, val, n := nextField(b)
		if n < 0 {
			return out, false
		}
		b = b[n:]
		if wt == protowire.VarintType && (num == 1 || num == 2) {
			v, _ := fieldValue(wt, val)
			if num == 1 {
				secs = int64(v)
			} else {
				nanos = int64(int32(v))
			}
		}
	}
	if p.wkt == wktTimestamp {
		if secs < minTimestampSeconds || secs > maxTimestampSeconds || nanos < 0 || nanos > maxNanos {
			return out, false
		}
		out = append(out, '"')
		start := len(out)
		out = appendTimestamp(out, secs, nanos)
		out = trimNanos(out, start)
		return append(out, 'Z', '"'), true
	}
	if secs < -maxDurationSeconds || secs > maxDurationSeconds || nanos < -maxNanos || nanos > maxNanos ||
		(secs > 0 && nanos < 0) || (secs < 0 && nanos > 0) {
		return out, false
	}
	out = append(out, '"')
	start := len(out)
	if secs < 0 || nanos < 0 {
		out = append(out, '-')
		secs, nanos = -secs, -nanos
	}
	out = strconv.AppendInt(out, secs, 10)
	out = append(out, '.')
	frac := strconv.AppendInt(make([]byte, 0, 9), nanos, 10)
	for i := len(frac); i < 9; i++ {
		out = append(out, '0')
	}
	out = append(out, frac...)
	out = trimNanos(out, start)
	return append(out, 's', '"'), true
}

// trimNanos drops trailing zero groups of a ".000000000" fraction: 0, 3, 6
// or 9 digits remain, as protojson writes them.
func trimNanos(out []byte, start int) []byte {
	for i := 0; i < 2; i++ {
		if n := len(out); n-start >= 3 && string(out[n-3:]) == "000" {
			out = out[:n-3]
		}
	}
	if n := len(out); n-start >= 4 && string(out[n-4:]) == ".000" {
		out = out[:n-4]
	}
	return out
}

func (d *fastDecoder) wrapper(out []byte, p *plan, b []byte) ([]byte, bool) {
	f := p.byNumber(1)
	e := entry{wt: wireType(f.kind)}
	for len(b) > 0 {
		num, wt, val, n := nextField(b)
		if n < 0 {
			return out, false
		}
		b = b[n:]
		if num == 1 && wt == e.wt {
			e.v, e.b = fieldValue(wt, val)
		}
	}
	if f.kind == protoreflect.StringKind && !utf8.Valid(e.b) {
		return out, false
	}
	return d.scalar(out, f, e)
}

// nextField reads the field at the start of wire data b: its number, wire
// type and value bytes, and the length of the whole (n < 0: malformed).
func nextField(b []byte) (num protowire.Number, wt protowire.Type, val []byte, n int) {
	num, wt, n = protowire.ConsumeTag(b)
	if n < 0 || num > protowire.MaxValidNumber {
		return 0, 0, nil, -1
	}
	m := protowire.ConsumeFieldValue(num, wt, b[n:])
	if m < 0 {
		return 0, 0, nil, -1
	}
	return num, wt, b[n : n+m], n + m
}

// fieldValue reads one field's value of wire type wt from val (already
// checked to hold a whole value): scalars in v, length-delimited in b.
func fieldValue(wt protowire.Type, val []byte) (v uint64, b []byte) {
	switch wt {
	case protowire.VarintType:
		v, _ = protowire.ConsumeVarint(val)
	case protowire.Fixed32Type:
		v32, _ := protowire.ConsumeFixed32(val)
		v = uint64(v32)
	case protowire.Fixed64Type:
		v, _ = protowire.ConsumeFixed64(val)
	case protowire.BytesType:
		b, _ = protowire.ConsumeBytes(val)
	}
	return v, b
}
