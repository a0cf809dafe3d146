package qrpc

import (
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// checkStuck runs when call id on this stream timed out. A stream that
// has answered nothing sent at or after id becomes suspect; it is stuck
// when another stream of the same connection answers a call sent after id
// (the connection is alive and the server answers, but not here), which
// may be now or later (see answered). That is the reference server's
// unknown-method case: it stops reading a stream without closing it.
func (st *cstream) checkStuck(id uint64) {
	s := st.sess
	if st.retired.Load() || st.lastAnswered.Load() >= id || s.dead.Load() {
		return
	}
	if !st.stuckSince.CompareAndSwap(0, id) {
		return // already suspect since an earlier call
	}
	s.suspects.Add(1)
	if s.maxAnswered.Load() > id {
		st.stuck()
	}
}

// answered runs for every response, on the stream that got it: the
// stream is alive; a suspect stream whose timed-out call is older than
// this answer is stuck.
func (st *cstream) answered(id uint64) {
	s := st.sess
	atomicMax(&st.lastAnswered, id)
	atomicMax(&s.maxAnswered, id)
	if s.suspects.Load() == 0 {
		return
	}
	if since := st.stuckSince.Load(); since != 0 && since <= id && st.stuckSince.CompareAndSwap(since, 0) {
		s.suspects.Add(-1)
	}
	for i := range s.streams {
		if o := s.streams[i].Load(); o != nil && o != st {
			if since := o.stuckSince.Load(); since != 0 && since < id {
				o.stuck()
			}
		}
	}
}

// stuck retires a stream that stopped answering and replaces it. Its
// other calls keep their own deadlines; the stream is cancelled when the
// last of them ends.
func (st *cstream) stuck() {
	s := st.sess
	if since := st.stuckSince.Swap(0); since != 0 {
		s.suspects.Add(-1)
	}
	if !st.retired.CompareAndSwap(false, true) {
		return
	}
	s.c.cfg.Logger.Debug("qrpc stream stopped answering, replacing it", "addr", s.c.addr)
	if st.inflight.Load() <= 0 {
		st.cancel()
	}
	s.replace(st)
}

// callDone counts one call of this stream as ended. The last one to end
// while the reader holds a large frame still arriving leaves that frame
// to nobody: the stream is abandoned.
func (st *cstream) callDone() {
	if st.inflight.Add(-1) > 0 {
		return
	}
	if st.retired.Load() {
		st.cancel()
		return
	}
	if fr := st.fr.Load(); fr != nil && fr.Growing() && st.mayAbandon() {
		st.abandon()
	}
}

// abandon retires a stream whose reader is in the middle of a large
// frame that no call waits for (a server that announced a large answer
// and does not finish it, or finishes it after the call ended). Reused,
// the stream would keep the partial frame's buffer, up to
// max_frame_size, for the connection's life, and its next calls would
// wait behind the frame. Cancelling it ends the read and frees the
// buffer; another stream takes its place. Calls sent on it meanwhile keep
// their deadlines, as on a stuck stream.
func (st *cstream) abandon() {
	s := st.sess
	if since := st.stuckSince.Swap(0); since != 0 {
		s.suspects.Add(-1)
	}
	if !st.retired.CompareAndSwap(false, true) {
		return
	}
	st.abandoned.Store(true)
	s.c.cfg.Logger.Debug("qrpc stream holds a partial answer nobody waits for, replacing it", "addr", s.c.addr)
	if st.inflight.Load() <= 0 {
		st.cancel()
	}
	s.replace(st)
}

// Process-wide: when releaseMemory last ran (unix ns), and whether a run
// is scheduled.
var (
	lastRelease    atomic.Int64
	releasePending atomic.Bool
)

// releaseMemory returns the heap's free memory to the system soon, in
// one run for the requests of the next 200 ms, and at most every 2 s. It
// runs when an abandoned stream's reader has let go of its partial frame:
// such a frame is up to max_frame_size per stream, and the worker may
// make no allocation that would start a GC for minutes, keeping the
// pages of a hostile server's frames in its RSS.
func releaseMemory(c *Client) {
	if !releasePending.CompareAndSwap(false, true) {
		return // the scheduled run covers this request too
	}
	wait := max(200*time.Millisecond, time.Until(time.Unix(0, lastRelease.Load()).Add(2*time.Second)))
	c.clk.AfterFunc(wait, safego.Func("release memory", func() {
		lastRelease.Store(time.Now().UnixNano())
		releasePending.Store(false)
		debug.FreeOSMemory()
	}, nil))
}

func atomicMax(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}
