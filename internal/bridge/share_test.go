package bridge

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// The step record both ways: results as share.lua writes them, ops as it
// reads them.
func TestShareRecord(t *testing.T) {
	var b []byte
	b = binary.LittleEndian.AppendUint16(b, 4)
	put := func(typ byte, v string) {
		b = append(b, typ)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	put(resNil, "")
	put(resString, "\x00bin")
	put(resNumber, "1733500000123")
	put(resTrue, "")
	r := shareReader{b: b}
	res, err := decodeResults(&r)
	if err != nil || len(r.b) != 0 || r.bad {
		t.Fatal(err, r.bad)
	}
	if res[0].OK || string(res[1].Value) != "\x00bin" || res[2].N != 1733500000123 || !res[3].OK {
		t.Fatalf("decoded %+v", res)
	}
	for _, bad := range [][]byte{{1, 0, 9, 0, 0, 0, 0}, {1, 0, 2, 3, 0, 0, 0, 'x', 'y', 'z'}, {2, 0}} {
		r := shareReader{b: bad}
		if res, err := decodeResults(&r); err == nil && !r.bad {
			t.Errorf("%q decoded as %+v", bad, res)
		}
	}
	out := encodeOps([]qrpc.StoreOp{
		{Kind: qrpc.OpGet, Key: "v"},
		{Kind: qrpc.OpIncr, Key: "g:a", Delta: 1, Init: 77, TTL: time.Minute},
	}, true)
	want := []byte{1, 2, 0,
		qrpc.OpGet, 1, 0, 'v', 0, 0, 0, 0, 0, 0, 0, 0,
		qrpc.OpIncr, 3, 0, 'g', ':', 'a', 4, 0, 0, 0, '1', ' ', '7', '7', 0x60, 0xea, 0, 0}
	if string(out) != string(want) {
		t.Fatalf("ops encoded as %v, want %v", out, want)
	}
}
