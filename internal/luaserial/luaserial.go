// Package luaserial writes JSON values in LuaJIT's string.buffer
// serialization format (https://luajit.org/ext_buffer.html#serialize), so
// that the Lua module turns a decoded response into a table with one C
// call (buffer.decode) instead of parsing JSON text on the nginx thread:
// no number parsing there, and every table is created at its final size.
//
// The mapping is the one lua-cjson's decode gives: objects and arrays are
// tables (arrays 1-based), numbers are Lua numbers (doubles, parsed as
// strtod does: correctly rounded), strings are byte strings, true/false
// are booleans and null is the NULL light userdata (cjson.null, ngx.null).
//
// LuaJIT documents the format and keeps it upwards compatible; it only
// asks that it not be used as a general data exchange format. Here it
// crosses from Go to the LuaJIT of the same process and is read back at
// once, never stored; the Lua module requires string.buffer.
package luaserial

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// MaxDepth is the nesting LuaJIT's decoder accepts (LJ_SERIALIZE_DEPTH):
// a deeper value would fail there, so it fails here.
const MaxDepth = 100

// Tags of the format.
const (
	tagFalse   = 0x01
	tagTrue    = 0x02
	tagNull    = 0x03
	tagNum     = 0x07
	tagTab     = 0x08    // empty table
	tagHash    = 0x09    // h.U h*{key value}
	tagArray1  = 0x0c    // a.U (a-1)*value: 1-based array, a = n+1
	tagStr     = 0x20    // (0x20+len).U bytes
	maxTabSize = 1 << 26 // LuaJIT's limit on a hash part (LJ_MAX_HBITS)
)

// ErrDuplicateKey is returned for an object with a key twice: LuaJIT's
// decoder refuses a table with a key twice.
var ErrDuplicateKey = errors.New("duplicate key")

// ErrTooDeep is returned (wrapped with the offset) for nesting deeper
// than MaxDepth, which LuaJIT's decoder refuses.
var ErrTooDeep = fmt.Errorf("nested more than %d levels", MaxDepth)

// FromJSON appends the serialization of the JSON value js to dst. It
// fails on invalid JSON, nesting deeper than MaxDepth (ErrTooDeep), a
// duplicate key in an object (ErrDuplicateKey), an object or array of
// 2^26 values or more, and a \u escape that is not valid UTF-16 (a lone
// surrogate).
func FromJSON(dst, js []byte) ([]byte, error) {
	return AppendJSON(dst, js, 0)
}

type parser struct {
	in  []byte
	pos int
	out []byte
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// appendU124 writes n in the format's prefix-encoded unsigned form.
func appendU124(out []byte, n uint32) []byte {
	switch {
	case n < 0xe0:
		return append(out, byte(n))
	case n < 0x1fe0:
		m := n - 0xe0
		return append(out, byte(0xe0|(m>>8)), byte(m))
	}
	out = append(out, 0xff)
	return binary.LittleEndian.AppendUint32(out, n)
}

// patchCount replaces the 5 bytes reserved at at (0xff + u32) with the
// shortest form of n, moving what follows.
func patchCount(out []byte, at int, n uint32) []byte {
	var tmp [5]byte
	enc := appendU124(tmp[:0], n)
	copy(out[at:], enc)
	if len(enc) < 5 {
		copy(out[at+len(enc):], out[at+5:])
		out = out[:len(out)-(5-len(enc))]
	}
	return out
}

func (p *parser) value(depth int) error {
	p.skipSpace()
	if p.pos >= len(p.in) {
		return p.errorf("unexpected end of JSON")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.str()
	case c == 't':
		return p.literal("true", tagTrue)
	case c == 'f':
		return p.literal("false", tagFalse)
	case c == 'n':
		return p.literal("null", tagNull)
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	default:
		return p.errorf("unexpected character %q", c)
	}
}

func (p *parser) literal(word string, tag byte) error {
	if len(p.in)-p.pos < len(word) || string(p.in[p.pos:p.pos+len(word)]) != word {
		return p.errorf("invalid literal")
	}
	p.pos += len(word)
	p.out = append(p.out, tag)
	return nil
}

func (p *parser) object(depth int) error {
	if depth >= MaxDepth {
		return fmt.Errorf("at offset %d: %w", p.pos, ErrTooDeep)
	}
	p.pos++ // {
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		p.out = append(p.out, tagTab)
		return nil
	}
	start := len(p.out)
	p.out = append(p.out, tagHash, 0xff, 0, 0, 0, 0)
	// (start, end) offsets in out of the keys written, to find
	// duplicates; on the stack for the usual sizes
	var keyBuf [32]int
	keys := keyBuf[:0]
	n := uint32(0)
	for {
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return p.errorf("expected a key")
		}
		kstart := len(p.out)
		if err := p.str(); err != nil {
			return err
		}
		if p.duplicate(keys, kstart) {
			return ErrDuplicateKey
		}
		keys = append(keys, kstart, len(p.out))
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return p.errorf("expected ':'")
		}
		p.pos++
		if err := p.value(depth + 1); err != nil {
			return err
		}
		if n++; n >= maxTabSize {
			return p.errorf("object too large")
		}
		p.skipSpace()
		if p.pos >= len(p.in) {
			return p.errorf("unexpected end of JSON")
		}
		if c := p.in[p.pos]; c == '}' {
			p.pos++
			break
		} else if c != ',' {
			return p.errorf("expected ',' or '}'")
		}
		p.pos++
	}
	p.out = patchCount(p.out, start+1, n)
	return nil
}

// duplicate reports whether the key just written at kstart equals one of
// the object's earlier keys. Objects from protobuf are small: a linear
// scan costs less than a map. Nested values move bytes only after their
// own start, so the offsets of earlier keys stay right.
func (p *parser) duplicate(keys []int, kstart int) bool {
	k := p.out[kstart:]
	for i := 0; i < len(keys); i += 2 {
		if string(p.out[keys[i]:keys[i+1]]) == string(k) {
			return true
		}
	}
	return false
}

func (p *parser) array(depth int) error {
	if depth >= MaxDepth {
		return fmt.Errorf("at offset %d: %w", p.pos, ErrTooDeep)
	}
	p.pos++ // [
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		p.out = append(p.out, tagTab)
		return nil
	}
	start := len(p.out)
	p.out = append(p.out, tagArray1, 0xff, 0, 0, 0, 0)
	n := uint32(0)
	for {
		if err := p.value(depth + 1); err != nil {
			return err
		}
		if n++; n >= maxTabSize {
			return p.errorf("array too large")
		}
		p.skipSpace()
		if p.pos >= len(p.in) {
			return p.errorf("unexpected end of JSON")
		}
		if c := p.in[p.pos]; c == ']' {
			p.pos++
			break
		} else if c != ',' {
			return p.errorf("expected ',' or ']'")
		}
		p.pos++
	}
	// a counts slot 0, which a 1-based array leaves empty
	p.out = patchCount(p.out, start+1, n+1)
	return nil
}

// number writes a JSON number as a double, rounded as strtod (and so
// cjson) rounds it.
func (p *parser) number() error {
	start := p.pos
	i := p.pos
	if i < len(p.in) && p.in[i] == '-' {
		i++
	}
	digits := func() int {
		j := i
		for i < len(p.in) && p.in[i] >= '0' && p.in[i] <= '9' {
			i++
		}
		return i - j
	}
	if d := digits(); d == 0 || d > 1 && p.in[i-d] == '0' {
		return p.errorf("invalid number")
	}
	if i < len(p.in) && p.in[i] == '.' {
		i++
		if digits() == 0 {
			return p.errorf("invalid number")
		}
	}
	if i < len(p.in) && (p.in[i] == 'e' || p.in[i] == 'E') {
		i++
		if i < len(p.in) && (p.in[i] == '+' || p.in[i] == '-') {
			i++
		}
		if digits() == 0 {
			return p.errorf("invalid number")
		}
	}
	f, err := strconv.ParseFloat(string(p.in[start:i]), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return p.errorf("invalid number")
	}
	// out of range: ±Inf or 0, as strtod gives
	p.pos = i
	p.out = append(p.out, tagNum)
	p.out = binary.LittleEndian.AppendUint64(p.out, math.Float64bits(f))
	return nil
}

// str writes a JSON string (p.pos at its opening quote) as a Lua string.
// The common case, no escapes, is one copy.
func (p *parser) str() error {
	i := p.pos + 1
	for i < len(p.in) {
		c := p.in[i]
		if c == '"' {
			s := p.in[p.pos+1 : i]
			p.out = appendU124(p.out, tagStr+uint32(len(s)))
			p.out = append(p.out, s...)
			p.pos = i + 1
			return nil
		}
		if c == '\\' {
			return p.escapedStr()
		}
		if c < 0x20 {
			p.pos = i
			return p.errorf("control character in string")
		}
		i++
	}
	return p.errorf("unterminated string")
}

// escapedStr is str for a string with escapes: unescaped into a scratch
// area after out, then its length prefix is written in front.
func (p *parser) escapedStr() error {
	// Reserve the longest prefix (5 bytes), write the bytes, then move
	// them back over the unused part.
	at := len(p.out)
	p.out = append(p.out, 0, 0, 0, 0, 0)
	i := p.pos + 1
	for {
		if i >= len(p.in) {
			return p.errorf("unterminated string")
		}
		c := p.in[i]
		switch {
		case c == '"':
			n := len(p.out) - at - 5
			var tmp [5]byte
			enc := appendU124(tmp[:0], tagStr+uint32(n))
			copy(p.out[at:], enc)
			copy(p.out[at+len(enc):], p.out[at+5:])
			p.out = p.out[:len(p.out)-(5-len(enc))]
			p.pos = i + 1
			return nil
		case c < 0x20:
			p.pos = i
			return p.errorf("control character in string")
		case c != '\\':
			p.out = append(p.out, c)
			i++
			continue
		}
		if i+1 >= len(p.in) {
			return p.errorf("unterminated string")
		}
		e := p.in[i+1]
		i += 2
		switch e {
		case '"', '\\', '/':
			p.out = append(p.out, e)
		case 'b':
			p.out = append(p.out, '\b')
		case 'f':
			p.out = append(p.out, '\f')
		case 'n':
			p.out = append(p.out, '\n')
		case 'r':
			p.out = append(p.out, '\r')
		case 't':
			p.out = append(p.out, '\t')
		case 'u':
			r, ok := hex4(p.in, i)
			if !ok {
				p.pos = i
				return p.errorf("invalid \\u escape")
			}
			i += 4
			if r >= 0xd800 && r < 0xdc00 {
				lo, ok := -1, false
				if i+1 < len(p.in) && p.in[i] == '\\' && p.in[i+1] == 'u' {
					lo, ok = hex4(p.in, i+2)
				}
				if !ok || lo < 0xdc00 || lo >= 0xe000 {
					p.pos = i
					return p.errorf("lone surrogate in \\u escape")
				}
				i += 6
				r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
			} else if r >= 0xdc00 && r < 0xe000 {
				p.pos = i
				return p.errorf("lone surrogate in \\u escape")
			}
			p.out = utf8.AppendRune(p.out, rune(r))
		default:
			p.pos = i - 1
			return p.errorf("invalid escape")
		}
	}
}

func hex4(b []byte, i int) (int, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v := 0
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | int(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | int(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | int(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}
