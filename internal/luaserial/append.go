package luaserial

import (
	"encoding/binary"
	"math"
)

// The writers below let a decoder that is not a JSON parser (the protobuf
// decoder of internal/transcode) write the same bytes FromJSON writes for
// the same value, without JSON text in between.

// AppendString appends s as a Lua string.
func AppendString[S string | []byte](out []byte, s S) []byte {
	out = appendU124(out, tagStr+uint32(len(s)))
	return append(out, s...)
}

// AppendStringHeader appends the prefix of a Lua string of n bytes, for a
// writer that then appends the bytes itself.
func AppendStringHeader(out []byte, n int) []byte {
	return appendU124(out, tagStr+uint32(n))
}

// AppendNumber appends a Lua number (FromJSON writes every JSON number as a
// double).
func AppendNumber(out []byte, f float64) []byte {
	out = append(out, tagNum)
	return binary.LittleEndian.AppendUint64(out, math.Float64bits(f))
}

// AppendBool appends true or false; AppendNull appends JSON's null.
func AppendBool(out []byte, b bool) []byte {
	if b {
		return append(out, tagTrue)
	}
	return append(out, tagFalse)
}

// AppendNull appends JSON's null (the NULL light userdata in Lua).
func AppendNull(out []byte) []byte { return append(out, tagNull) }

// OpenTable reserves room for a table's header at the end of out and
// returns where it is; the keys and values (or the array's values) follow,
// then CloseHash or CloseArray writes the header.
func OpenTable(out []byte) ([]byte, int) {
	at := len(out)
	return append(out, tagHash, 0xff, 0, 0, 0, 0), at
}

// CloseHash finishes the table opened at at as an object of n keys (an
// empty one is the empty table, as FromJSON writes "{}"). ok is false for
// a table bigger than LuaJIT takes.
func CloseHash(out []byte, at int, n int) ([]byte, bool) {
	return closeTable(out, at, tagHash, n)
}

// CloseArray finishes the table opened at at as an array of n values.
func CloseArray(out []byte, at int, n int) ([]byte, bool) {
	// a counts slot 0, which a 1-based array leaves empty
	return closeTable(out, at, tagArray1, n)
}

func closeTable(out []byte, at int, tag byte, n int) ([]byte, bool) {
	if n >= maxTabSize {
		return out, false
	}
	if n == 0 {
		return append(out[:at], tagTab), true
	}
	out[at] = tag
	if tag == tagArray1 {
		n++
	}
	return patchCount(out, at+1, uint32(n)), true
}

// AppendJSON appends FromJSON's serialization of the JSON value js as a
// value nested depth levels deep in a bigger one: the depth limit counts
// from the outermost table.
func AppendJSON(dst, js []byte, depth int) ([]byte, error) {
	p := parser{in: js, out: dst}
	if err := p.value(depth); err != nil {
		return dst, err
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return dst, p.errorf("trailing characters")
	}
	return p.out, nil
}
