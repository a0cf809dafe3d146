package bridge

import (
	"encoding/binary"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// QRPC_OP_POOL_SHARE exchanges a pool's health with the other workers'
// views of it (the Lua side keeps the shared copy in a lua_shared_dict:
// lua/resty/ffi/qrpc/share.lua; share_record.lua there encodes and
// decodes the record). Both ways the record is binary, little-endian:
//
//	request (opts):  u8 roles (1: this view probes, 2: it resolves)
//	                 u64 the resolved-list generation the caller has seen
//	                 verdicts, then a resolved list (count 0: none)
//	                 u64 u64 the other views' adaptive throttling window:
//	                 requests, accepts
//	answer:          u64 this view's resolved-list generation
//	                 this view's runs, then its resolved list when the
//	                 generation differs from the one seen
//	                 u64 u64 this view's throttling window
//	verdicts:        u16 n, then n × (u8 flags (1 ejected, 2 stalled,
//	                 4 ejection unknown: leave it as it is, 8 the run is
//	                 given, 16 the run reached health.failures with this
//	                 view's own failures: eject), u32 ms of ejection
//	                 left, u32 the run of failures in a row over every
//	                 view, u16 len, addr)
//	runs:            u16 n, then n × (u8 flags (1 ejected, 2 stalled),
//	                 u32 ms of ejection left, u32 failures counted
//	                 towards the run (ever, wrapping), u32 runs ended (an
//	                 answer after failures, the server back; wrapping),
//	                 u32 failures counted since the last run ended,
//	                 u16 len, addr)
//	resolved list:   u16 n, then n × (u16 priority, u16 weight,
//	                 u16 len, addr, u16 len, TLS name)
//
// A verdict for a server the pool does not have is ignored (the views may
// be between two resolutions).

const (
	shareProbe   = 1
	shareResolve = 2

	verdictEjected = 1
	verdictStalled = 2
	verdictKeep    = 4
	verdictRun     = 8
	verdictReached = 16
)

// maxShareEntries bounds both lists of a record.
const maxShareEntries = 4096

type shareReader struct {
	b   []byte
	bad bool
}

func (r *shareReader) take(n int) []byte {
	if r.bad || len(r.b) < n {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *shareReader) u8() uint8 {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *shareReader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *shareReader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *shareReader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *shareReader) str() string { return string(r.take(int(r.u16()))) }

// shareRequest is a decoded request record.
type shareRequest struct {
	roles            uint8
	seenGen          uint64
	verdicts         []qrpc.Verdict
	resolved         []qrpc.Resolved
	othReqs, othAccs uint64
}

func decodeShare(b []byte) (shareRequest, error) {
	r := shareReader{b: b}
	var q shareRequest
	q.roles = r.u8()
	q.seenGen = r.u64()
	n := int(r.u16())
	if n > maxShareEntries {
		return q, Badf("pool share: %d verdicts, at most %d", n, maxShareEntries)
	}
	for i := 0; i < n && !r.bad; i++ {
		f := r.u8()
		ms := r.u32()
		run := r.u32()
		q.verdicts = append(q.verdicts, qrpc.Verdict{
			Addr:     r.str(),
			Ejected:  f&verdictEjected != 0,
			EjectFor: time.Duration(ms) * time.Millisecond,
			Stalled:  f&verdictStalled != 0,
			Keep:     f&verdictKeep != 0,
			HasRun:   f&verdictRun != 0,
			Run:      int(min(run, 1<<31-1)),
			Reached:  f&verdictReached != 0,
		})
	}
	n = int(r.u16())
	if n > maxShareEntries {
		return q, Badf("pool share: %d addresses, at most %d", n, maxShareEntries)
	}
	for i := 0; i < n && !r.bad; i++ {
		var e qrpc.Resolved
		e.Priority, e.Weight = r.u16(), r.u16()
		e.Addr = r.str()
		e.Name = r.str()
		q.resolved = append(q.resolved, e)
	}
	q.othReqs, q.othAccs = r.u64(), r.u64()
	if r.bad || len(r.b) != 0 {
		return q, Badf("pool share: malformed record (%d bytes)", len(b))
	}
	return q, nil
}

func appendShareStr(b []byte, s string) []byte {
	s = s[:min(len(s), 0xffff)]
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func encodeShareView(v qrpc.ShareView) []byte {
	b := binary.LittleEndian.AppendUint64(nil, v.ResolvedGen)
	b = binary.LittleEndian.AppendUint16(b, uint16(min(len(v.Peers), maxShareEntries)))
	for i, p := range v.Peers {
		if i == maxShareEntries {
			break
		}
		var f uint8
		if p.Ejected {
			f |= verdictEjected
		}
		if p.Stalled {
			f |= verdictStalled
		}
		ms := min(p.EjectFor.Milliseconds(), 1<<32-1)
		b = append(b, f)
		b = binary.LittleEndian.AppendUint32(b, uint32(ms))
		b = binary.LittleEndian.AppendUint32(b, p.Counted)
		b = binary.LittleEndian.AppendUint32(b, p.Resets)
		b = binary.LittleEndian.AppendUint32(b, p.SinceReset)
		b = appendShareStr(b, p.Addr)
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(min(len(v.Resolved), maxShareEntries)))
	for i, e := range v.Resolved {
		if i == maxShareEntries {
			break
		}
		b = binary.LittleEndian.AppendUint16(b, e.Priority)
		b = binary.LittleEndian.AppendUint16(b, e.Weight)
		b = appendShareStr(b, e.Addr)
		b = appendShareStr(b, e.Name)
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(v.Requests))
	return binary.LittleEndian.AppendUint64(b, uint64(v.Accepts))
}

// PoolShare answers QRPC_OP_POOL_SHARE for connection h.
func (r *Runtime) PoolShare(h uint64, rec []byte) ([]byte, error) {
	q, err := decodeShare(rec)
	if err != nil {
		return nil, err
	}
	c := r.lookup(h)
	if c == nil {
		return nil, qrpc.ErrClosed
	}
	p := c.client
	p.SetRoles(q.roles&shareProbe != 0, q.roles&shareResolve != 0)
	if len(q.resolved) > 0 {
		if err := p.ImportResolved(q.resolved); err != nil {
			return nil, err
		}
	}
	if len(q.verdicts) > 0 {
		p.Import(q.verdicts)
	}
	p.SetOthersThrottle(int64(min(q.othReqs, 1<<62)), int64(min(q.othAccs, 1<<62)))
	return encodeShareView(p.View(q.seenGen)), nil
}

func init() {
	RegisterQuery(OpPoolShare, func(r *Runtime, cmd *Command) ([]byte, error) {
		return r.PoolShare(cmd.Conn, cmd.Opts)
	})
}
