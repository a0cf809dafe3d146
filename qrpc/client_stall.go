package qrpc

import (
	"sync/atomic"
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

// callDone counts one call of this stream as ended.
func (st *cstream) callDone() {
	if st.inflight.Add(-1) <= 0 && st.retired.Load() {
		st.cancel()
	}
}

func atomicMax(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}
