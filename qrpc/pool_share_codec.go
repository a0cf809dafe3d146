package qrpc

import "encoding/binary"

// The records a shared pool keeps in the store (pool_share.go): only Go
// reads them.

// verdictRec is a verdict as the store keeps it.
type verdictRec struct {
	eject    bool
	until    int64 // CLOCK_MONOTONIC ns
	ejectFor int64
}

const verdictVersion = 1

func (r verdictRec) encode() []byte {
	b := make([]byte, 0, 18)
	f := byte(0)
	if r.eject {
		f = 1
	}
	b = append(b, verdictVersion, f)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.until))
	return binary.LittleEndian.AppendUint64(b, uint64(r.ejectFor))
}

func decodeVerdict(b []byte) (verdictRec, bool) {
	if len(b) != 18 || b[0] != verdictVersion || b[1] > 1 {
		return verdictRec{}, false
	}
	return verdictRec{eject: b[1] == 1, until: int64(binary.LittleEndian.Uint64(b[2:])),
		ejectFor: max(0, int64(binary.LittleEndian.Uint64(b[10:])))}, true
}

func appendStr(b []byte, s string) []byte {
	s = s[:min(len(s), 0xffff)]
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// encodeList: u16 n, then n × (u16 priority, u16 weight, u16 split,
// u16 len, addr, u16 len, name).
func encodeList(list []Resolved) []byte {
	n := min(len(list), maxPeers)
	b := binary.LittleEndian.AppendUint16(nil, uint16(n))
	for _, e := range list[:n] {
		b = binary.LittleEndian.AppendUint16(b, e.Priority)
		b = binary.LittleEndian.AppendUint16(b, e.Weight)
		b = binary.LittleEndian.AppendUint16(b, e.Split)
		b = appendStr(b, e.Addr)
		b = appendStr(b, e.Name)
	}
	return b
}

func decodeList(b []byte) ([]Resolved, bool) {
	if len(b) < 2 {
		return nil, false
	}
	n := int(binary.LittleEndian.Uint16(b))
	if n > maxPeers {
		return nil, false
	}
	b = b[2:]
	str := func() (string, bool) {
		if len(b) < 2 {
			return "", false
		}
		l := int(binary.LittleEndian.Uint16(b))
		if len(b) < 2+l {
			return "", false
		}
		s := string(b[2 : 2+l])
		b = b[2+l:]
		return s, true
	}
	out := make([]Resolved, 0, n)
	for range n {
		if len(b) < 6 {
			return nil, false
		}
		e := Resolved{Priority: binary.LittleEndian.Uint16(b), Weight: binary.LittleEndian.Uint16(b[2:]), Split: binary.LittleEndian.Uint16(b[4:])}
		b = b[6:]
		var ok1, ok2 bool
		e.Addr, ok1 = str()
		e.Name, ok2 = str()
		if !ok1 || !ok2 {
			return nil, false
		}
		out = append(out, e)
	}
	return out, len(b) == 0
}
