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
		if v.HasRun {
			f |= verdictRun
		}
		if v.Reached {
			f |= verdictReached
		}
		b = append(b, f)
		b = binary.LittleEndian.AppendUint32(b, uint32(v.EjectFor.Milliseconds()))
		b = binary.LittleEndian.AppendUint32(b, uint32(v.Run))
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

// decodeShareAnswer reads an answer record as share.go documents it (the
// Lua side's decode).
func decodeShareAnswer(b []byte) (v qrpc.ShareView, ok bool) {
	r := shareReader{b: b}
	v.ResolvedGen = r.u64()
	n := int(r.u16())
	for i := 0; i < n && !r.bad; i++ {
		f := r.u8()
		p := qrpc.Verdict{Ejected: f&verdictEjected != 0, Stalled: f&verdictStalled != 0}
		p.EjectFor = time.Duration(r.u32()) * time.Millisecond
		p.Counted, p.Resets, p.SinceReset = r.u32(), r.u32(), r.u32()
		p.Addr = r.str()
		v.Peers = append(v.Peers, p)
	}
	n = int(r.u16())
	for i := 0; i < n && !r.bad; i++ {
		var e qrpc.Resolved
		e.Priority, e.Weight = r.u16(), r.u16()
		e.Addr, e.Name = r.str(), r.str()
		v.Resolved = append(v.Resolved, e)
	}
	v.Requests, v.Accepts = int64(r.u64()), int64(r.u64())
	return v, !r.bad && len(r.b) == 0
}

func TestShareRecord(t *testing.T) {
	vs := []qrpc.Verdict{
		{Addr: "127.0.0.1:1", Ejected: true, EjectFor: 1500 * time.Millisecond},
		{Addr: "[::1]:2", Stalled: true, Keep: true},
		{Addr: "127.0.0.1:3", Keep: true, HasRun: true, Run: 7, Reached: true},
	}
	list := []qrpc.Resolved{{Addr: "127.0.0.1:1", Name: "a.test", Priority: 10, Weight: 3}}
	q, err := decodeShare(shareRecord(3, 7, vs, list))
	if err != nil {
		t.Fatal(err)
	}
	if q.roles != 3 || q.seenGen != 7 || q.othReqs != 5 || q.othAccs != 4 || len(q.verdicts) != 3 ||
		q.verdicts[0] != vs[0] || q.verdicts[1] != vs[1] || q.verdicts[2] != vs[2] ||
		len(q.resolved) != 1 || q.resolved[0] != list[0] {
		t.Errorf("decoded %+v", q)
	}
	rec := shareRecord(0, 0, vs, nil)
	for _, bad := range [][]byte{nil, rec[:len(rec)-1], append(rec[:len(rec):len(rec)], 0, 0, 0)} {
		if _, err := decodeShare(bad); err == nil {
			t.Errorf("%x: no error", bad)
		}
	}
	// the answer: each server's verdict and the run this view counted
	runs := []qrpc.Verdict{
		{Addr: "127.0.0.1:1", Ejected: true, EjectFor: 1500 * time.Millisecond, Counted: 1<<32 - 1, Resets: 2, SinceReset: 1},
		{Addr: "[::1]:2", Stalled: true, Counted: 5},
	}
	out := encodeShareView(qrpc.ShareView{Peers: runs, ResolvedGen: 9, Resolved: list, Requests: 12, Accepts: 3})
	v, ok := decodeShareAnswer(out)
	if !ok || v.ResolvedGen != 9 || len(v.Peers) != 2 || v.Peers[0] != runs[0] || v.Peers[1] != runs[1] ||
		len(v.Resolved) != 1 || v.Resolved[0] != list[0] || v.Requests != 12 || v.Accepts != 3 {
		t.Errorf("answer decoded as %+v (whole: %v)", v, ok)
	}
}

func FuzzDecodeShare(f *testing.F) {
	f.Add(shareRecord(1, 2, []qrpc.Verdict{{Addr: "x:1", Ejected: true}}, []qrpc.Resolved{{Addr: "x:1"}}))
	f.Add(shareRecord(0, 0, []qrpc.Verdict{{Addr: "x:1", Keep: true, HasRun: true, Run: 1<<31 + 5, Reached: true}}, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := decodeShare(b)
		if err == nil && len(q.verdicts)+len(q.resolved) > len(b) {
			t.Fatalf("%d entries from %d bytes", len(q.verdicts)+len(q.resolved), len(b))
		}
		for _, v := range q.verdicts {
			if v.Run < 0 {
				t.Fatalf("a negative run from %x: %+v", b, v)
			}
		}
	})
}
