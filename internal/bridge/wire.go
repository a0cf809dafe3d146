package bridge

import (
	"encoding/binary"
	"math"
)

// The record block (internal/schema's WireKeys document the format): what
// qrpc_cmd_t.opts carries into the library and what the query ops answer.
// Decoding views the block in place and allocates nothing; every malformed
// block is a Badf error naming what is wrong, never a panic (FuzzRecords).

const (
	recStr uint8 = iota + 1
	recInt
	recFloat
)

// recHead is a record's [uint16 key][uint32 length].
const recHead = 6

// maxOptsLen bounds an opts block: a few hundred addresses at most.
const maxOptsLen = 64 << 10

// Rec is one record of a block; Val points into the block.
type Rec struct {
	Key uint16
	Val []byte
}

// Int is an int record's value.
func (r Rec) Int() int64 { return int64(binary.NativeEndian.Uint64(r.Val)) }

// Float is a float record's value.
func (r Rec) Float() float64 { return math.Float64frombits(binary.NativeEndian.Uint64(r.Val)) }

// Str is a str record's value, copied.
func (r Rec) Str() string { return string(r.Val) }

// eachRec calls f with each record of b, after checking that the record
// is whole, its key known and a number's length 8; a malformed record or
// f's error ends it.
func eachRec(b []byte, f func(Rec) error) error {
	return eachRecMax(b, maxOptsLen, f)
}

// eachRecMax is eachRec for a block of at most max bytes.
func eachRecMax(b []byte, max int, f func(Rec) error) error {
	if len(b) > max {
		return Badf("opts: %d bytes, at most %d", len(b), max)
	}
	for len(b) > 0 {
		if len(b) < recHead {
			return Badf("opts: a record cut short (%d bytes)", len(b))
		}
		key := binary.NativeEndian.Uint16(b)
		n := binary.NativeEndian.Uint32(b[2:])
		if uint64(n) > uint64(len(b)-recHead) {
			return Badf("opts: record %d: %d bytes, %d left", key, n, len(b)-recHead)
		}
		if int(key) >= len(wireTypes) || wireTypes[key] == 0 {
			return Badf("opts: unknown record key %d", key)
		}
		if t := wireTypes[key]; (t == recInt || t == recFloat) && n != 8 {
			return Badf("opts: record %d: a number of %d bytes", key, n)
		}
		if err := f(Rec{Key: key, Val: b[recHead : recHead+int(n)]}); err != nil {
			return err
		}
		b = b[recHead+int(n):]
	}
	return nil
}

func appendHead(b []byte, key uint16, n int) []byte {
	b = binary.NativeEndian.AppendUint16(b, key)
	return binary.NativeEndian.AppendUint32(b, uint32(n))
}

// AppendStr, AppendInt and AppendFloat append one record to b.
func AppendStr(b []byte, key uint16, s string) []byte {
	return append(appendHead(b, key, len(s)), s...)
}

func AppendInt(b []byte, key uint16, v int64) []byte {
	return binary.NativeEndian.AppendUint64(appendHead(b, key, 8), uint64(v))
}

func AppendFloat(b []byte, key uint16, v float64) []byte {
	return binary.NativeEndian.AppendUint64(appendHead(b, key, 8), math.Float64bits(v))
}
