package bridge

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// shareRecord builds a request record as share.go documents it.
func shareRecord(roles uint8, gen uint64, vs []qrpc.Verdict, list []qrpc.Resolved) []byte {
	b := []byte{roles}
	b = binary.LittleEndian.AppendUint64(b, gen)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(vs)))
	for _, v := range vs {
		var f uint8
		if v.Ejected {
			f |= verdictEjected
		}
		if v.Stalled {
			f |= verdictStalled
		}
		if v.Keep {
			f |= verdictKeep
		}
		b = append(b, f)
		b = binary.LittleEndian.AppendUint32(b, uint32(v.EjectFor.Milliseconds()))
		b = appendShareStr(b, v.Addr)
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(list)))
	for _, e := range list {
		b = binary.LittleEndian.AppendUint16(b, e.Priority)
		b = binary.LittleEndian.AppendUint16(b, e.Weight)
		b = appendShareStr(b, e.Addr)
		b = appendShareStr(b, e.Name)
	}
	b = binary.LittleEndian.AppendUint64(b, 5)
	return binary.LittleEndian.AppendUint64(b, 4)
}

func TestShareRecord(t *testing.T) {
	vs := []qrpc.Verdict{
		{Addr: "127.0.0.1:1", Ejected: true, EjectFor: 1500 * time.Millisecond},
		{Addr: "[::1]:2", Stalled: true, Keep: true},
	}
	list := []qrpc.Resolved{{Addr: "127.0.0.1:1", Name: "a.test", Priority: 10, Weight: 3}}
	q, err := decodeShare(shareRecord(3, 7, vs, list))
	if err != nil {
		t.Fatal(err)
	}
	if q.roles != 3 || q.seenGen != 7 || q.othReqs != 5 || q.othAccs != 4 || len(q.verdicts) != 2 || q.verdicts[0] != vs[0] || q.verdicts[1] != vs[1] ||
		len(q.resolved) != 1 || q.resolved[0] != list[0] {
		t.Errorf("decoded %+v", q)
	}
	rec := shareRecord(0, 0, vs, nil)
	for _, bad := range [][]byte{nil, rec[:len(rec)-1], append(rec[:len(rec):len(rec)], 0, 0, 0)} {
		if _, err := decodeShare(bad); err == nil {
			t.Errorf("%x: no error", bad)
		}
	}
	// the answer's form is the request's, past the roles
	out := encodeShareView(qrpc.ShareView{Peers: vs[:1], ResolvedGen: 9, Resolved: list, Requests: 12, Accepts: 3})
	q, err = decodeShare(append([]byte{0}, out...))
	if err != nil || q.seenGen != 9 || len(q.verdicts) != 1 || q.verdicts[0] != vs[0] || len(q.resolved) != 1 ||
		q.othReqs != 12 || q.othAccs != 3 {
		t.Errorf("answer decoded as %+v, %v", q, err)
	}
}

func FuzzDecodeShare(f *testing.F) {
	f.Add(shareRecord(1, 2, []qrpc.Verdict{{Addr: "x:1", Ejected: true}}, []qrpc.Resolved{{Addr: "x:1"}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := decodeShare(b)
		if err == nil && len(q.verdicts)+len(q.resolved) > len(b) {
			t.Fatalf("%d entries from %d bytes", len(q.verdicts)+len(q.resolved), len(b))
		}
	})
}
