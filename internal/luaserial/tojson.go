package luaserial

// The other direction: a request body that Lua serialized with
// string.buffer (buffer:encode of the table, one C call) read as JSON
// text in the proto3 JSON mapping, for the requests that
// internal/transcode's EncodeLua leaves to protojson (maps, well-known
// types, unknown fields, discard_unknown, values that do not match, whose
// errors protojson's diagnosis words).
//
// The table → JSON mapping:
//   - a table whose keys are exactly 1..n (n ≥ 1) is an array, any other
//     an object; an empty table is {} unless it carries one of the array
//     metatables (Lua lists them in the encoder's metatable dictionary,
//     so they arrive as tab_mt);
//   - object keys are strings, integers in (-1e15, 1e15) written with
//     %d, or 64-bit integer cdata (1LL, 2ULL) written with their exact
//     digits (the JSON names of a map<int64, ...>'s keys: protojson
//     reads them exactly, and words a key its type cannot hold as it
//     words a value); any other key is an error;
//   - numbers: NaN and ±inf as "NaN", "Infinity", "-Infinity" (protojson's
//     spellings); integers in (-1e15, 1e15) as digits ("-0" for -0);
//     other integers in (-2^64, 2^64) as their exact digits (2^60 as
//     1152921504606846976, not 1.152921504606847e+18, which protojson
//     reads as the integer 1152921504606847000 for a 64-bit field);
//     others with the shorter of %.15g and %.17g that reads back the same
//     double;
//   - strings: ", \ and the control characters (0-31, 127) escaped, the
//     other bytes as they are;
//   - JSON null for the NULL light userdata (ngx.null, cjson.null); a
//     64-bit integer cdata (1LL, 2ULL) as a decimal string; any other light
//     userdata or cdata is an error.
// Key order is the order Lua's pairs() gives, which is also the order
// string.buffer writes a table's slots in.

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"sync"
)

// MaxInput bounds the serialized body ToJSON reads. Each table is walked
// once per table above it, at most MaxDepth times, and the text it
// writes is at most six times the input plus a constant per value.
const MaxInput = 64 << 20

// ValueError is a table no JSON (and so no message) is read from, in the
// Lua module's words for a refused request table: "cannot encode a userdata value", "table keys must be
// strings or integers (got boolean)". Lua shows it as
// "bad argument #3: body: <What>".
type ValueError struct{ What string }

func (e *ValueError) Error() string { return e.What }

// MalformedError is data that string.buffer does not write: never from
// the Lua module; from a corrupt or hostile body.
type MalformedError struct {
	Offset int
	What   string
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("malformed Lua table data at offset %d: %s", e.Offset, e.What)
}

const (
	tagNil     = 0x00
	tagLightU4 = 0x04
	tagLightU8 = 0x05
	tagInt     = 0x06
	tagArray0  = 0x0a // a.U a*value: 0-based array
	tagMixed0  = 0x0b // a.U h.U a*value h*{key value}: 0-based array and hash part
	tagMixed1  = 0x0d // a.U h.U (a-1)*value h*{key value}
	tagTabMT   = 0x0e // (index-1).U table: a table with a listed metatable
	tagStrDict = 0x0f
	tagInt64   = 0x10
	tagUint64  = 0x11
	tagComplex = 0x12
)

// ToJSON appends to dst the JSON text of ser, one value (a table, from
// the Lua module) in string.buffer's format.
func ToJSON(dst, ser []byte) ([]byte, error) {
	out, _, err := toJSON(dst, ser, nil, false)
	return out, err
}

// A Mark is a value ToJSON wrote as a JSON string that was not a Lua
// string: NaN, ±inf ("NaN", "Infinity", "-Infinity", which a float or
// double field reads as the number), or a 64-bit integer cdata (its
// digits, which a 64-bit integer field reads exactly). Where a value of
// any JSON type is read (google.protobuf.Value) they would be strings.
type Mark struct {
	At, End int     // the string in the output, quotes included
	Num     float64 // the number: NaN, ±inf, or the cdata's value rounded
	Cdata   bool    // a 64-bit integer cdata; Exact tells whether Num is its value
	Exact   bool
}

// ToJSONMarked is ToJSON, also appending to marks the values written as
// Marks, in order.
func ToJSONMarked(dst, ser []byte, marks []Mark) ([]byte, []Mark, error) {
	return toJSON(dst, ser, marks, true)
}

func toJSON(dst, ser []byte, marks []Mark, mark bool) ([]byte, []Mark, error) {
	if len(ser) > MaxInput {
		return dst, marks, &MalformedError{What: fmt.Sprintf("%d bytes, more than %d", len(ser), MaxInput)}
	}
	d := decoders.Get().(*decoder)
	defer d.release()
	d.in, d.pos, d.out, d.marks, d.mark = ser, 0, dst, marks, mark
	if err := d.value(0); err != nil {
		return dst, marks, err
	}
	if d.pos != len(d.in) {
		return dst, marks, d.malformed("trailing bytes")
	}
	return d.out, d.marks, nil
}

// decoders keep their scratch slices from call to call: a request would
// otherwise grow them from nothing.
var decoders = sync.Pool{New: func() any { return &decoder{} }}

func (d *decoder) release() {
	d.in, d.out, d.marks = nil, nil, nil
	// a huge table's scratch is not kept
	if cap(d.entries) > 4096 || cap(d.order) > 4096 {
		return
	}
	d.entries, d.order = d.entries[:0], d.order[:0]
	decoders.Put(d)
}

// entry is a slot of a table: its key (kind and where to read it) and
// where its value starts.
type entry struct {
	kind  byte    // tagNum (number key, in num), tagStr (bytes at key..keyEnd), tagInt64 or tagUint64 (in bits), or another tag: a key refused
	num   float64 // tagNum
	bits  uint64  // tagInt64, tagUint64: the cdata's 64 bits
	key   int     // tagStr: offset of the bytes
	klen  int
	value int // offset of the value
}

type decoder struct {
	in      []byte
	pos     int
	out     []byte
	entries []entry // the slots of the tables being written, innermost last
	order   []int   // arrays: entry indices by key
	marks   []Mark  // with mark
	mark    bool
}

func (d *decoder) malformed(what string) error {
	return &MalformedError{Offset: d.pos, What: what}
}

func (d *decoder) need(n int) error {
	if len(d.in)-d.pos < n {
		return d.malformed("unexpected end of data")
	}
	return nil
}

func (d *decoder) u124() (uint32, error) {
	if err := d.need(1); err != nil {
		return 0, err
	}
	b := d.in[d.pos]
	switch {
	case b < 0xe0:
		d.pos++
		return uint32(b), nil
	case b < 0xff:
		if err := d.need(2); err != nil {
			return 0, err
		}
		v := (uint32(b&0x1f)<<8 | uint32(d.in[d.pos+1])) + 0xe0
		d.pos += 2
		return v, nil
	}
	if err := d.need(5); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint32(d.in[d.pos+1:])
	d.pos += 5
	return v, nil
}

// u124n is u124 as an int.
func (d *decoder) u124n() (int, error) {
	n, err := d.u124()
	return int(n), err
}

// str reads a string's length prefix (its tag) and returns its bytes' offset and length.
func (d *decoder) str() (int, int, error) {
	v, err := d.u124()
	if err != nil {
		return 0, 0, err
	}
	n := int(v - tagStr)
	if v < tagStr || n > len(d.in)-d.pos {
		return 0, 0, d.malformed("bad string length")
	}
	at := d.pos
	d.pos += n
	return at, n, nil
}

// skip moves past one value, checking its structure only: ValueErrors are
// found when the value is written, in the order pairs() gives.
func (d *decoder) skip(depth int) error {
	if err := d.need(1); err != nil {
		return err
	}
	switch t := d.in[d.pos]; {
	case t >= tagStr:
		_, _, err := d.str()
		return err
	case t == tagFalse || t == tagTrue || t == tagNull:
		d.pos++
		return nil
	case t == tagLightU4 || t == tagInt:
		d.pos++
		return d.advance(4)
	case t == tagLightU8 || t == tagNum || t == tagInt64 || t == tagUint64:
		d.pos++
		return d.advance(8)
	case t == tagComplex:
		d.pos++
		return d.advance(16)
	case t >= tagTab && t <= tagTabMT:
		_, _, err := d.table(depth, false)
		return err
	}
	return d.malformed(fmt.Sprintf("unexpected tag 0x%02x", d.in[d.pos]))
}

func (d *decoder) advance(n int) error {
	if err := d.need(n); err != nil {
		return err
	}
	d.pos += n
	return nil
}

// table reads the table at pos. Its slots are appended to d.entries
// (values skipped); it returns the index of its first one and whether it
// carries an array metatable. With keep false the slots are dropped.
func (d *decoder) table(depth int, keep bool) (first int, marked bool, err error) {
	if depth >= MaxDepth {
		return 0, false, d.malformed(fmt.Sprintf("nested more than %d levels", MaxDepth))
	}
	first = len(d.entries)
	if !keep {
		// a skipped table's slots are not needed: dropped when it is read
		defer d.truncate(first)
	}
	tag := d.in[d.pos]
	d.pos++
	if tag == tagTabMT {
		if _, err := d.u124(); err != nil {
			return first, false, err
		}
		if err := d.need(1); err != nil {
			return first, false, err
		}
		marked = true
		tag = d.in[d.pos]
		if tag < tagTab || tag > tagMixed1 {
			return first, false, d.malformed("tab_mt without a table")
		}
		d.pos++
	}
	if tag == tagTab {
		return first, marked, nil
	}
	a, h := 0, 0
	base := 0 // the key of the array part's first slot
	if tag != tagHash {
		if a, err = d.u124n(); err != nil {
			return first, false, err
		}
		if tag == tagArray1 || tag == tagMixed1 {
			// a counts slot 0, which a 1-based array leaves out
			if a == 0 {
				return first, false, d.malformed("1-based array of size 0")
			}
			base, a = 1, a-1
		}
	}
	if tag == tagHash || tag == tagMixed0 || tag == tagMixed1 {
		if h, err = d.u124n(); err != nil {
			return first, false, err
		}
	}
	// every slot takes a byte at least (two in the hash part): a bound
	// for what the counts make us reserve
	if uint64(a)+2*uint64(h) > uint64(len(d.in)-d.pos) {
		return first, false, d.malformed(fmt.Sprintf("%d + %d slots, more than the data holds", a, h))
	}
	for i := 0; i < a; i++ {
		if err := d.need(1); err != nil {
			return first, false, err
		}
		if d.in[d.pos] == tagNil {
			d.pos++
			continue
		}
		d.entries = append(d.entries, entry{kind: tagNum, num: float64(base + i), value: d.pos})
		if err := d.skip(depth + 1); err != nil {
			return first, false, err
		}
	}
	hfirst := len(d.entries)
	for i := 0; i < h; i++ {
		e, err := d.key(depth)
		if err != nil {
			return first, false, err
		}
		e.value = d.pos
		d.entries = append(d.entries, e)
		if err := d.skip(depth + 1); err != nil {
			return first, false, err
		}
	}
	// string.buffer writes the hash part from its last node to its first;
	// pairs() goes the other way
	for i, j := hfirst, len(d.entries)-1; i < j; i, j = i+1, j-1 {
		d.entries[i], d.entries[j] = d.entries[j], d.entries[i]
	}
	return first, marked, nil
}

func (d *decoder) truncate(n int) { d.entries = d.entries[:n] }

// key reads a hash key.
func (d *decoder) key(depth int) (entry, error) {
	if err := d.need(1); err != nil {
		return entry{}, err
	}
	switch t := d.in[d.pos]; {
	case t >= tagStr:
		at, n, err := d.str()
		return entry{kind: tagStr, key: at, klen: n}, err
	case t == tagNum:
		d.pos++
		if err := d.need(8); err != nil {
			return entry{}, err
		}
		f := math.Float64frombits(binary.LittleEndian.Uint64(d.in[d.pos:]))
		d.pos += 8
		if math.IsNaN(f) {
			return entry{}, d.malformed("NaN key")
		}
		return entry{kind: tagNum, num: f}, nil
	case t == tagInt:
		d.pos++
		if err := d.need(4); err != nil {
			return entry{}, err
		}
		v := int32(binary.LittleEndian.Uint32(d.in[d.pos:]))
		d.pos += 4
		return entry{kind: tagNum, num: float64(v)}, nil
	case t == tagInt64 || t == tagUint64:
		d.pos++
		if err := d.need(8); err != nil {
			return entry{}, err
		}
		v := binary.LittleEndian.Uint64(d.in[d.pos:])
		d.pos += 8
		return entry{kind: t, bits: v}, nil
	case t == tagNil || t == tagStrDict || t > tagComplex && t < tagStr:
		return entry{}, d.malformed(fmt.Sprintf("unexpected key tag 0x%02x", t))
	}
	// a key the mapping refuses (boolean, table, userdata, cdata): its
	// structure checked now, refused when written
	e := entry{kind: d.in[d.pos]}
	return e, d.skip(depth + 1)
}

// value writes the value at pos.
func (d *decoder) value(depth int) error {
	if err := d.need(1); err != nil {
		return err
	}
	t := d.in[d.pos]
	switch {
	case t >= tagStr:
		at, n, err := d.str()
		if err != nil {
			return err
		}
		d.out = appendString(d.out, d.in[at:at+n])
		return nil
	case t == tagFalse:
		d.out = append(d.out, "false"...)
	case t == tagTrue:
		d.out = append(d.out, "true"...)
	case t == tagNull:
		d.out = append(d.out, "null"...)
	case t == tagNum:
		if err := d.need(9); err != nil {
			return err
		}
		f := math.Float64frombits(binary.LittleEndian.Uint64(d.in[d.pos+1:]))
		at := len(d.out)
		d.out = appendNumber(d.out, f)
		if d.mark && (math.IsNaN(f) || math.IsInf(f, 0)) {
			d.marks = append(d.marks, Mark{At: at, End: len(d.out), Num: f})
		}
		d.pos += 9
		return nil
	case t == tagInt:
		if err := d.need(5); err != nil {
			return err
		}
		d.out = strconv.AppendInt(d.out, int64(int32(binary.LittleEndian.Uint32(d.in[d.pos+1:]))), 10)
		d.pos += 5
		return nil
	case t == tagInt64 || t == tagUint64:
		if err := d.need(9); err != nil {
			return err
		}
		v := binary.LittleEndian.Uint64(d.in[d.pos+1:])
		at := len(d.out)
		d.out = append(d.out, '"')
		var f float64
		var exact bool
		if t == tagInt64 {
			d.out = strconv.AppendInt(d.out, int64(v), 10)
			f = float64(int64(v))
			exact = f != 0x1p63 && int64(f) == int64(v)
		} else {
			d.out = strconv.AppendUint(d.out, v, 10)
			f = float64(v)
			exact = f != 0x1p64 && uint64(f) == v
		}
		d.out = append(d.out, '"')
		if d.mark {
			d.marks = append(d.marks, Mark{At: at, End: len(d.out), Num: f, Cdata: true, Exact: exact})
		}
		d.pos += 9
		return nil
	case t == tagLightU4 || t == tagLightU8:
		return &ValueError{What: "cannot encode a userdata value"}
	case t == tagComplex:
		return &ValueError{What: "cannot encode a cdata value"}
	case t >= tagTab && t <= tagTabMT:
		return d.writeTable(depth)
	default:
		return d.malformed(fmt.Sprintf("unexpected tag 0x%02x", t))
	}
	d.pos++
	return nil
}

func (d *decoder) writeTable(depth int) error {
	first, marked, err := d.table(depth, true)
	if err != nil {
		return err
	}
	end := d.pos
	defer func() { d.entries = d.entries[:first] }()
	n := len(d.entries) - first
	if n == 0 {
		if marked {
			d.out = append(d.out, "[]"...)
		} else {
			d.out = append(d.out, "{}"...)
		}
		return nil
	}
	// an array if the keys are 1..n: n distinct integers in [1, n]
	array := true
	for i := first; i < first+n; i++ {
		e := &d.entries[i]
		if e.kind != tagNum || e.num < 1 || e.num > float64(n) || e.num != math.Trunc(e.num) {
			array = false
			break
		}
	}
	if array {
		o := len(d.order)
		for i := 0; i < n; i++ {
			d.order = append(d.order, -1)
		}
		for i := first; i < first+n; i++ {
			slot := &d.order[o+int(d.entries[i].num)-1]
			if *slot >= 0 {
				// not from a Lua table, whose keys are unique
				d.order = d.order[:o]
				d.pos = d.entries[i].value
				return d.malformed("duplicate key")
			}
			*slot = i
		}
		d.out = append(d.out, '[')
		for k := 0; k < n; k++ {
			if k > 0 {
				d.out = append(d.out, ',')
			}
			d.pos = d.entries[d.order[o+k]].value
			if err := d.value(depth + 1); err != nil {
				d.order = d.order[:o]
				return err
			}
		}
		d.order = d.order[:o]
		d.out = append(d.out, ']')
		d.pos = end
		return nil
	}
	d.out = append(d.out, '{')
	for i := first; i < first+n; i++ {
		if i > first {
			d.out = append(d.out, ',')
		}
		e := d.entries[i]
		switch {
		case e.kind == tagStr:
			d.out = appendString(d.out, d.in[e.key:e.key+e.klen])
		case e.kind == tagNum && e.num == math.Trunc(e.num) && e.num > -1e15 && e.num < 1e15:
			d.out = append(d.out, '"')
			d.out = strconv.AppendInt(d.out, int64(e.num), 10)
			d.out = append(d.out, '"')
		case e.kind == tagInt64:
			d.out = append(d.out, '"')
			d.out = strconv.AppendInt(d.out, int64(e.bits), 10)
			d.out = append(d.out, '"')
		case e.kind == tagUint64:
			d.out = append(d.out, '"')
			d.out = strconv.AppendUint(d.out, e.bits, 10)
			d.out = append(d.out, '"')
		default:
			return &ValueError{What: "table keys must be strings or integers (got " + keyName(e) + ")"}
		}
		d.out = append(d.out, ':')
		d.pos = e.value
		if err := d.value(depth + 1); err != nil {
			return err
		}
	}
	d.out = append(d.out, '}')
	d.pos = end
	return nil
}

// keyName names a refused key as Lua would: tostring of a number, else
// the key's Lua type.
func keyName(e entry) string {
	switch {
	case e.kind == tagNum:
		return luaNumber(e.num)
	case e.kind == tagFalse || e.kind == tagTrue:
		return "boolean"
	case e.kind >= tagTab && e.kind <= tagTabMT:
		return "table"
	case e.kind == tagComplex:
		return "cdata"
	}
	return "userdata" // light userdata, NULL (ngx.null) included
}

// luaNumber is LuaJIT's tostring of a number: %.14g, "inf", "-inf".
func luaNumber(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	return strconv.FormatFloat(f, 'g', 14, 64)
}

// AppendJSONNumber writes f as ToJSON does, by the mapping's number rule
// (see the top).
func AppendJSONNumber(out []byte, f float64) []byte { return appendNumber(out, f) }

// appendNumber writes f by the mapping's number rule (see the top).
func appendNumber(out []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(out, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(out, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(out, `"-Infinity"`...)
	case f == math.Trunc(f) && f > -1e15 && f < 1e15:
		if f == 0 && math.Signbit(f) {
			return append(out, "-0"...) // tostring(-0)
		}
		return strconv.AppendInt(out, int64(f), 10)
	case f == math.Trunc(f) && f > -0x1p64 && f < 0x1p64:
		return strconv.AppendFloat(out, f, 'f', 0, 64) // exact: every digit
	}
	n := len(out)
	out = strconv.AppendFloat(out, f, 'g', 15, 64)
	if back, err := strconv.ParseFloat(string(out[n:]), 64); err != nil || back != f {
		out = strconv.AppendFloat(out[:n], f, 'g', 17, 64)
	}
	return out
}

// appendString writes s quoted, escaped by the mapping's string rule.
func appendString(out, s []byte) []byte {
	out = append(out, '"')
	start := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' && c != 0x7f {
			continue
		}
		out = append(out, s[start:i]...)
		start = i + 1
		switch c {
		case '"':
			out = append(out, '\\', '"')
		case '\\':
			out = append(out, '\\', '\\')
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			const hex = "0123456789abcdef"
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}
