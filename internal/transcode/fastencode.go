package transcode

import (
	"encoding/base64"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// fastEncoder writes the protobuf encoding of proto3 JSON, or of a Lua
// table in string.buffer's format (lua, see EncodeLua), straight from the
// input, in the bytes proto.MarshalOptions{Deterministic: true} gives
// (fields by number, map entries by key). ok == false means "let protojson
// do it": invalid or unusual input (see plan), which protojson then either
// accepts or explains. The walk is in walker.go; this file has the JSON
// text's reader, fastlua.go the Lua table's.
type fastEncoder struct {
	reg     *Registry
	discard bool
	lua     bool
	in      []byte // the input
	pos     int    // the read position in it
	depth   int    // objects and arrays open around the read position
}

// maxFastDepth bounds the fast path's nesting: it opens no object or
// array (a message, a list, a map, a value it skips or hands to
// protojson) when that many are open. Deeper input goes to the slow
// path, which refuses more than maxRequestDepth levels and hands the
// rest to protojson.
const maxFastDepth = 64

// segment is one field's (or map entry's) bytes in the output, to put
// them in the order the Go encoder uses when the JSON had them in another.
type segment struct {
	start, end int
}

func (e *fastEncoder) ws() {
	for e.pos < len(e.in) {
		switch e.in[e.pos] {
		case ' ', '\t', '\n', '\r':
			e.pos++
		default:
			return
		}
	}
}

func (e *fastEncoder) peek() byte {
	e.ws()
	if e.pos < len(e.in) {
		return e.in[e.pos]
	}
	return 0
}

func (e *fastEncoder) consume(c byte) bool {
	if e.peek() == c {
		e.pos++
		return true
	}
	return false
}

// jsonNext reads what comes after an object's or array's opening bracket
// (first) or after one of its values: a ',' and more to come, or the
// closing bracket.
func (e *fastEncoder) jsonNext(closing byte, first bool) (more, ok bool) {
	switch c := e.peek(); {
	case c == closing:
		e.pos++
		return false, true
	case first:
		return true, true
	case c == ',':
		e.pos++
		return true, true
	}
	return false, false
}

// fieldOrder puts a message's fields, written in input order, in the Go
// encoder's order (by rank). The caller keeps segs, the fields written in
// input order, on its stack (held here, behind the pointer receiver, they
// would escape to the heap); at[r] is where the field of rank r is in segs
// when bit r of present is set. Walking present's bits gives the output
// order: no sort, nothing to clear but at's 64 bytes. It also refuses a
// field given twice, and two fields of one oneof (messages of more than
// 64 fields or oneofs do not take the fast paths).
type fieldOrder struct {
	at                       [64]uint8
	seen, seenOneof, present uint64
	sorted                   bool
	lastRank                 int
}

func newFieldOrder() fieldOrder { return fieldOrder{sorted: true, lastRank: -1} }

// claim reports whether f may be written: not seen before in this message,
// and no other field of its oneof either.
func (o *fieldOrder) claim(f *fieldPlan) bool {
	if o.seen&(1<<f.idx) != 0 {
		return false
	}
	o.seen |= 1 << f.idx
	if f.oneof >= 0 {
		if o.seenOneof&(1<<f.oneof) != 0 {
			return false
		}
		o.seenOneof |= 1 << f.oneof
	}
	return true
}

// wrote records that f was written as out[start:end] (nothing, for a
// default value) and returns segs with it.
func (o *fieldOrder) wrote(segs []segment, f *fieldPlan, start, end int) []segment {
	if end == start {
		return segs
	}
	if f.rank < o.lastRank {
		o.sorted = false
	}
	o.lastRank = f.rank
	o.at[f.rank] = uint8(len(segs))
	o.present |= 1 << f.rank
	return append(segs, segment{start: start, end: end})
}

// finish rewrites out[base:] in rank order, when the input had another.
func (o *fieldOrder) finish(out []byte, base int, segs []segment) []byte {
	if o.sorted {
		return out
	}
	end := len(out)
	for m := o.present; m != 0; m &= m - 1 {
		s := segs[o.at[bits.TrailingZeros64(m)]]
		out = append(out, out[s.start:s.end]...)
	}
	return out[:base+copy(out[base:], out[end:])]
}

// reorder rewrites out[base:] as its segments in the order given. It
// builds the new order after the end of out and moves it back, so that it
// needs no buffer of its own: out's spare room (a pooled buffer) serves.
func reorder(out []byte, base int, segs []segment) []byte {
	end := len(out)
	for _, s := range segs {
		out = append(out, out[s.start:s.end]...)
	}
	return out[:base+copy(out[base:], out[end:])]
}

// finishLen writes the length of out[lenPos+1:] at lenPos, where one byte
// was reserved, moving the contents when the length needs more.
func finishLen(out []byte, lenPos int) []byte {
	n := len(out) - lenPos - 1
	if n < 0x80 {
		out[lenPos] = byte(n)
		return out
	}
	k := protowire.SizeVarint(uint64(n))
	out = append(out, make([]byte, k-1)...)
	copy(out[lenPos+k:], out[lenPos+1:lenPos+1+n])
	protowire.AppendVarint(out[lenPos:lenPos], uint64(n))
	return out
}

// sortMapEntries puts the map entries written as out[base:] in key order,
// or reports false for a key given twice (which protojson refuses).
func sortMapEntries(out []byte, base int, kind protoreflect.Kind, ents []mapEntry) ([]byte, bool) {
	byKey := func(a, b mapEntry) int { return compareMapKeys(kind, a.key, b.key) }
	if !slices.IsSortedFunc(ents, byKey) {
		slices.SortStableFunc(ents, byKey)
		var segStack [8]segment
		segs := segStack[:0]
		for _, m := range ents {
			segs = append(segs, segment{start: m.start, end: m.end})
		}
		out = reorder(out, base, segs)
	}
	for i := 1; i < len(ents); i++ {
		if byKey(ents[i-1], ents[i]) == 0 {
			return out, false
		}
	}
	return out, true
}

// parseMapKey parses an object key as a map key of kind f.kind.
func parseMapKey(f *fieldPlan, key []byte) (entry, bool) {
	switch f.kind {
	case protoreflect.StringKind:
		return entry{b: key}, true
	case protoreflect.BoolKind:
		switch string(key) {
		case "true":
			return entry{v: 1}, true
		case "false":
			return entry{v: 0}, true
		}
		return entry{}, false
	}
	if !isPlainInt(key) {
		return entry{}, false
	}
	return intEntry(f.kind, string(key))
}

func appendKey(out []byte, f *fieldPlan, k entry) []byte {
	out = protowire.AppendTag(out, 1, wireType(f.kind))
	if f.kind == protoreflect.StringKind {
		return protowire.AppendBytes(out, k.b)
	}
	return appendWire(out, f.kind, k.v)
}

// appendWire appends a value already in its wire form (e.v of an entry).
func appendWire(out []byte, k protoreflect.Kind, v uint64) []byte {
	switch wireType(k) {
	case protowire.Fixed32Type:
		return protowire.AppendFixed32(out, uint32(v))
	case protowire.Fixed64Type:
		return protowire.AppendFixed64(out, v)
	}
	return protowire.AppendVarint(out, v)
}

// intEntry parses s (plain digits) as kind k, in wire form, with the
// value's sign kept for ordering map keys.
func intEntry(k protoreflect.Kind, s string) (entry, bool) {
	switch k {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return entry{}, false
		}
		switch k {
		case protoreflect.Sint32Kind:
			return entry{v: protowire.EncodeZigZag(n)}, true
		case protoreflect.Sfixed32Kind:
			return entry{v: uint64(uint32(int32(n)))}, true
		}
		return entry{v: uint64(n)}, true
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return entry{}, false
		}
		if k == protoreflect.Sint64Kind {
			return entry{v: protowire.EncodeZigZag(n)}, true
		}
		return entry{v: uint64(n)}, true
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		n, err := strconv.ParseUint(s, 10, 32)
		return entry{v: n}, err == nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		n, err := strconv.ParseUint(s, 10, 64)
		return entry{v: n}, err == nil
	}
	return entry{}, false
}

// isPlainInt: -?(0|[1-9][0-9]*), the integers every path agrees on.
func isPlainInt(s []byte) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if len(s) == 0 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// finishLenAt rewrites the varint at lenPos (ending at dataPos) as the
// length of out[dataPos:].
func finishLenAt(out []byte, lenPos, dataPos int) []byte {
	n := len(out) - dataPos
	k := protowire.SizeVarint(uint64(n))
	if k == dataPos-lenPos {
		protowire.AppendVarint(out[lenPos:lenPos], uint64(n))
		return out
	}
	data := append([]byte(nil), out[dataPos:]...)
	out = protowire.AppendVarint(out[:lenPos], uint64(n))
	return append(out, data...)
}

// appendBase64 appends the bytes field written as s, standard or URL
// base64 with or without padding as protojson reads it, and tells whether
// it is empty.
func appendBase64(out, s []byte) ([]byte, bool, bool) {
	url := false
	for _, c := range s {
		if c == '-' || c == '_' {
			url = true
			break
		}
	}
	// The four encodings are package values: WithPadding would copy one
	// per field.
	var enc *base64.Encoding
	switch {
	case url && len(s)%4 != 0:
		enc = base64.RawURLEncoding
	case url:
		enc = base64.URLEncoding
	case len(s)%4 != 0:
		enc = base64.RawStdEncoding
	default:
		enc = base64.StdEncoding
	}
	n := enc.DecodedLen(len(s))
	out = protowire.AppendVarint(out, uint64(n)) // rewritten below
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

// appendTime appends the fields of a Timestamp or Duration (p) written
// as the string s.
func appendTime(out []byte, p *plan, s []byte) ([]byte, bool) {
	var secs int64
	var nanos int32
	var ok bool
	if p.wkt == wktTimestamp {
		secs, nanos, ok = parseTimestamp(string(s))
	} else {
		secs, nanos, ok = parseDuration(string(s))
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

func parseFloat(tok []byte, bitSize int) (float64, bool) {
	x, err := strconv.ParseFloat(string(tok), bitSize)
	return x, err == nil
}

func (e *fastEncoder) lit(s string) bool {
	e.ws()
	// Not strings.HasPrefix(string(e.in[e.pos:]), s): that copies the rest
	// of the input to the heap.
	if len(e.in)-e.pos >= len(s) && string(e.in[e.pos:e.pos+len(s)]) == s {
		e.pos += len(s)
		return true
	}
	return false
}

// number scans a JSON number token.
func (e *fastEncoder) number() ([]byte, bool) {
	e.ws()
	start := e.pos
	js := e.in
	i := e.pos
	if i < len(js) && js[i] == '-' {
		i++
	}
	switch {
	case i < len(js) && js[i] == '0':
		i++
	case i < len(js) && js[i] >= '1' && js[i] <= '9':
		i = digits(js, i)
	default:
		return nil, false
	}
	if i < len(js) && js[i] == '.' {
		d := i + 1
		if i = digits(js, d); i == d {
			return nil, false
		}
	}
	if i < len(js) && (js[i] == 'e' || js[i] == 'E') {
		i++
		if i < len(js) && (js[i] == '+' || js[i] == '-') {
			i++
		}
		d := i
		if i = digits(js, d); i == d {
			return nil, false
		}
	}
	e.pos = i
	return js[start:i], true
}

// digits returns the end of the run of decimal digits at js[i:].
func digits(js []byte, i int) int {
	for i < len(js) && js[i] >= '0' && js[i] <= '9' {
		i++
	}
	return i
}

// text reads a string, valid UTF-8. In the JSON text it scans a string
// and returns its value: a slice of the input when it has no escapes,
// else fresh memory. Invalid UTF-8 and lone surrogates are left to
// protojson. (The Lua table's case is here rather than behind one more
// call: the walk reads every key and string through it.)
func (e *fastEncoder) text() ([]byte, bool) {
	if e.lua {
		s, ok := e.luaShortString()
		if !ok {
			s, ok = e.luaString()
		}
		return s, ok && validUTF8(s)
	}
	if e.peek() != '"' {
		return nil, false
	}
	js := e.in
	start := e.pos + 1
	i := start
	for i < len(js) && !strStop[js[i]] {
		i++
	}
	ascii := true // valid UTF-8 without a second look
	if i < len(js) && js[i] >= utf8.RuneSelf {
		ascii = false
		for i < len(js) && (js[i] >= utf8.RuneSelf || !strStop[js[i]]) {
			i++
		}
	}
	switch {
	case i == len(js) || js[i] < ' ':
		return nil, false
	case js[i] == '\\':
		return e.strEscaped(start)
	}
	e.pos = i + 1
	s := js[start:i]
	return s, ascii || utf8.Valid(s)
}

// strStop marks the bytes that end a run of plain ASCII characters in a
// JSON string: the quote, the backslash, the control characters and the
// bytes of multi-byte UTF-8 sequences.
var strStop = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c < ' ' || c == '"' || c == '\\' || c >= utf8.RuneSelf
	}
	return t
}()

func (e *fastEncoder) strEscaped(start int) ([]byte, bool) {
	js := e.in
	var out []byte
	i := start
	for i < len(js) {
		c := js[i]
		switch {
		case c == '"':
			e.pos = i + 1
			return out, utf8.Valid(out)
		case c < ' ':
			return nil, false
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(js) {
			return nil, false
		}
		i += 2
		switch c := js[i-1]; {
		case unescapeLetter[c] != 0:
			out = append(out, unescapeLetter[c])
		case c == 'u':
			r, ok := hex4(js, i)
			if !ok {
				return nil, false
			}
			i += 4
			if utf16.IsSurrogate(r) {
				if i+6 > len(js) || js[i] != '\\' || js[i+1] != 'u' {
					return nil, false
				}
				r2, ok := hex4(js, i+2)
				if !ok {
					return nil, false
				}
				r = utf16.DecodeRune(r, r2)
				if r == utf8.RuneError {
					return nil, false
				}
				i += 6
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, false
		}
	}
	return nil, false
}

func hex4(js []byte, i int) (rune, bool) {
	if i+4 > len(js) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(js[i:i+4]), 16, 16)
	return rune(n), err == nil
}

// skip passes over one JSON value (an unknown field's, with discard),
// checking it is valid JSON as protojson would; depth objects and arrays
// are open around it.
func (e *fastEncoder) skip(depth int) bool {
	switch c := e.peek(); c {
	case '{', '[':
		if depth >= maxFastDepth {
			return false
		}
		e.pos++
		closing := c + 2 // '}' or ']'
		for i := 0; ; i++ {
			more, ok := e.jsonNext(closing, i == 0)
			if !ok || !more {
				return ok
			}
			if c == '{' {
				if _, ok := e.text(); !ok || !e.consume(':') {
					return false
				}
			}
			if !e.skip(depth + 1) {
				return false
			}
		}
	case '"':
		_, ok := e.text()
		return ok
	case 't':
		return e.lit("true")
	case 'f':
		return e.lit("false")
	case 'n':
		return e.lit("null")
	}
	_, ok := e.number()
	return ok
}

// parseTimestamp accepts the common form only, "2006-01-02T15:04:05Z"
// with up to nine fraction digits and Z or an offset, as protojson reads
// it; anything else goes to protojson.
func parseTimestamp(s string) (int64, int32, bool) {
	if secs, nanos, ok := parseTimestampUTC(s); ok {
		return secs, nanos, true
	}
	return parseTimestampGeneral(s)
}

// parseTimestampGeneral is parseTimestamp through the time package: the
// forms with an offset, and the judge of what parseTimestampUTC leaves.
func parseTimestampGeneral(s string) (int64, int32, bool) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, 0, false
	}
	// protojson's extra rules: at most nine fraction digits, and a
	// lowercase t or z is refused.
	if i := strings.IndexByte(s, '.'); i >= 0 {
		j := i + 1
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j-i-1 > 9 {
			return 0, 0, false
		}
	}
	if strings.ContainsAny(s, "tz") {
		return 0, 0, false
	}
	secs := t.Unix()
	if secs < minTimestampSeconds || secs > maxTimestampSeconds {
		return 0, 0, false
	}
	return secs, int32(t.Nanosecond()), true
}

// parseDuration accepts [-]digits[.1-9 digits]s; protojson handles the
// rest ("+1s", ".5s", "1.s").
func parseDuration(s string) (int64, int32, bool) {
	if len(s) < 2 || s[len(s)-1] != 's' {
		return 0, 0, false
	}
	s = s[:len(s)-1]
	neg := false
	if s[0] == '-' {
		neg = true
		s = s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	if !isPlainInt([]byte(intPart)) || intPart[0] == '-' {
		return 0, 0, false
	}
	if hasFrac && (len(frac) == 0 || len(frac) > 9 || !isPlainDigits(frac)) {
		return 0, 0, false
	}
	secs, err := strconv.ParseInt(intPart, 10, 64)
	if err != nil || secs > maxDurationSeconds {
		return 0, 0, false
	}
	var nanos int64
	if hasFrac {
		n, _ := strconv.ParseInt(frac, 10, 64)
		for i := len(frac); i < 9; i++ {
			n *= 10
		}
		nanos = n
	}
	if neg {
		secs, nanos = -secs, -nanos
	}
	return secs, int32(nanos), true
}

func isPlainDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
