package bridge

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// StatusShare is QRPC_SHARE: a completion (handle = a shared pool's
// connection) asking the host for a step of that pool.
const StatusShare int32 = 4

// QRPC_OP_POOL_SHARE runs a shared pool's steps (qrpc/pool_share.go: the
// logic; lua/resty/ffi/qrpc/share.lua: the store, a lua_shared_dict).
// Both ways the record is binary, little-endian:
//
//	request (opts):  u8 mode, then
//	                 mode 3 (attach): u16 slot, u16 slots
//	                 mode 1 (step): nothing, or the results (as below) of
//	                 the ops the last step's answer gave for the next
//	                 mode 2 (exit): nothing
//	                 mode 0 (go on): u16 n, then n results of the ops asked
//	                 last: u8 type (0 absent/false, 1 a string, 2 a number,
//	                 3 true), u32 len, the bytes (a number in decimal)
//	answer:          u8 more (1: run the ops and call back with their
//	                 results; 0: run them, the step is over; 2: as 0, and
//	                 the ops that follow them are the next step's first:
//	                 run them when it begins and send their results with
//	                 it), u16 n, then n × (u8 op (1 get, 2 add, 3 set,
//	                 4 incr, 5 delete), u16 len, key, u32 len, value (incr:
//	                 "delta init" in decimal), u32 TTL in ms (0: none))
//
// Attach answers u32: the lease period in ms (0: the pool needs no lease
// tick), then u8: 1 when Go asks for the lease steps itself (QRPC_SHARE
// completions of the built-in host), 0 when the host must tick (the
// lua-resty-ffi host).
const (
	shareGoOn   = 0
	shareStep   = 1
	shareExit   = 2
	shareAttach = 3

	resNil    = 0
	resString = 1
	resNumber = 2
	resTrue   = 3
)

// maxShareOps bounds a request's results (a pool has at most
// qrpc.MaxPoolServers servers, a step a few ops per server).
const maxShareOps = 8192

type shareReader struct {
	b   []byte
	bad bool
}

func (r *shareReader) take(n int) []byte {
	if r.bad || n < 0 || len(r.b) < n {
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

func decodeResults(r *shareReader) ([]qrpc.StoreResult, error) {
	n := int(r.u16())
	if n > maxShareOps {
		return nil, Badf("pool share: %d results, at most %d", n, maxShareOps)
	}
	out := make([]qrpc.StoreResult, 0, n)
	for i := 0; i < n && !r.bad; i++ {
		t := r.u8()
		v := r.take(int(r.u32()))
		var res qrpc.StoreResult
		switch t {
		case resNil:
		case resString:
			res = qrpc.StoreResult{OK: true, Value: append([]byte{}, v...)}
		case resNumber:
			f, err := strconv.ParseFloat(string(v), 64)
			if err != nil {
				return nil, Badf("pool share: result %d: bad number %q", i+1, v)
			}
			res = qrpc.StoreResult{OK: true, Value: append([]byte{}, v...), N: int64(f)}
		case resTrue:
			res = qrpc.StoreResult{OK: true}
		default:
			return nil, Badf("pool share: result %d: unknown type %d", i+1, t)
		}
		out = append(out, res)
	}
	return out, nil
}

func appendShareStr16(b []byte, s string) []byte {
	s = s[:min(len(s), 0xffff)]
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func encodeOps(ops []qrpc.StoreOp, more bool) []byte {
	b := make([]byte, 0, 3+len(ops)*32)
	if more {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return appendOps(b, ops)
}

// encodeLast is a step's last answer: its ops, then the next step's first.
func encodeLast(ops, next []qrpc.StoreOp) []byte {
	b := encodeOps(ops, false)
	if len(next) == 0 {
		return b
	}
	b[0] = 2
	return appendOps(b, next)
}

func appendOps(b []byte, ops []qrpc.StoreOp) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(min(len(ops), 0xffff)))
	for _, op := range ops[:min(len(ops), 0xffff)] {
		b = append(b, op.Kind)
		b = appendShareStr16(b, op.Key)
		v := op.Value
		if op.Kind == qrpc.OpIncr {
			v = []byte(strconv.FormatInt(op.Delta, 10) + " " + strconv.FormatInt(op.Init, 10))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
		b = binary.LittleEndian.AppendUint32(b, uint32(min(op.TTL.Milliseconds(), 1<<32-1)))
	}
	return b
}

// PoolShare answers QRPC_OP_POOL_SHARE for connection h; async: the
// record came through the submit queue (PoolShareAsync), not qrpc_query.
func (r *Runtime) PoolShare(h uint64, rec []byte, async bool) ([]byte, error) {
	c := r.lookup(h)
	if c == nil {
		return nil, qrpc.ErrClosed
	}
	p := c.client
	rd := shareReader{b: rec}
	mode := rd.u8()
	var via int
	if async {
		via = qrpc.ShareAsync
	}
	switch mode {
	case shareAttach:
		slot, slots := int(rd.u16()), int(rd.u16())
		if rd.bad || len(rd.b) != 0 || slots < 1 || slot >= slots {
			return nil, Badf("pool share: malformed attach record (%d bytes)", len(rec))
		}
		var notify func() bool
		if hb, ok := c.host.Load().(hostBox); ok {
			if _, ok := hb.h.(shareNotifier); ok {
				notify = c.askShare
			}
		}
		p.Share(qrpc.ShareConfig{Slot: slot, Slots: slots, Notify: notify})
		b := binary.LittleEndian.AppendUint32(nil, uint32(p.LeasePeriod()/time.Millisecond))
		if notify != nil {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case shareStep, shareExit:
		m := qrpc.ShareStep
		if mode == shareExit {
			m = qrpc.ShareExit
		}
		var res []qrpc.StoreResult
		if mode == shareStep && len(rd.b) != 0 {
			var err error
			if res, err = decodeResults(&rd); err != nil {
				return nil, err
			}
		}
		if rd.bad || len(rd.b) != 0 {
			return nil, Badf("pool share: malformed step record (%d bytes)", len(rec))
		}
		ops, more := p.ShareStep(m|via, res)
		if !more && m == qrpc.ShareStep {
			return encodeLast(ops, p.ShareNext()), nil
		}
		return encodeOps(ops, more), nil
	case shareGoOn:
		res, err := decodeResults(&rd)
		if err != nil {
			return nil, err
		}
		if rd.bad || len(rd.b) != 0 {
			return nil, Badf("pool share: malformed results (%d bytes)", len(rec))
		}
		ops, more := p.ShareStep(via, res)
		if !more {
			return encodeLast(ops, p.ShareNext()), nil
		}
		return encodeOps(ops, more), nil
	}
	return nil, Badf("pool share: unknown mode %d", mode)
}

// The codes of a QRPC_SHARE completion: Go asks for a step (no data),
// or answers a record submitted through the queue (call id: the
// record's; data: the answer), or says it failed (data: the message).
const (
	ShareAsk    = 0
	ShareAnswer = 1
	ShareFailed = 2
)

// PoolShareAsync runs a QRPC_OP_POOL_SHARE record that came through the
// built-in host's submit queue, on the submitter: the answer goes back as
// a QRPC_SHARE completion, so that a step Go asked for never makes the
// nginx thread enter Go (a thread that has called into Go keeps a Go
// scheduler slot while it runs nginx, and Go's sysmon then watches it).
func (r *Runtime) PoolShareAsync(h Host, cmd *Command) (int32, string) {
	out, err := r.PoolShare(cmd.Conn, cmd.Opts, true)
	var c Completion
	if err != nil {
		_, msg := StatusOf(err)
		c = r.Message(StatusShare, msg, cmd.CallID)
		c.Code = ShareFailed
	} else {
		c = r.Message(StatusShare, string(out), cmd.CallID)
		c.Code = ShareAnswer
	}
	c.Handle = cmd.Conn
	h.Complete(c)
	return StatusPending, ""
}

// shareNotifier is a host that can ask its Lua side for a step of a
// shared pool (the built-in host: a QRPC_SHARE completion).
type shareNotifier interface {
	NotifyShare(handle uint64) bool
}

// askShare asks the host that dialled c for a step of its pool; a host
// that cannot be asked steps at the next call or lease tick.
func (c *conn) askShare() bool {
	if hb, ok := c.host.Load().(hostBox); ok {
		if n, ok := hb.h.(shareNotifier); ok {
			return n.NotifyShare(c.handle)
		}
	}
	return false
}

// hostBox keeps a Host in an atomic.Value (which wants one concrete type).
type hostBox struct{ h Host }

func init() {
	RegisterQuery(OpPoolShare, func(r *Runtime, cmd *Command) ([]byte, error) {
		return r.PoolShare(cmd.Conn, cmd.Opts, false)
	})
}
