package qrpc

import (
	"fmt"
	"sync"
	"time"
)

// expire times out a call whose deadline passed (the deadlines' timer).
func (s *qconn) expire(pc *pendingCall) {
	if s.take(pc.id) == nil {
		return // answered, cancelled or failed meanwhile
	}
	pc.st.unqueue(pc)
	pc.done(nil, fmt.Errorf("%w: no response within %v", ErrTimeout, pc.wait))
	pc.st.checkStuck(pc.id)
}

// abort fails a call with ErrInternal after a panic of the goroutine that
// held it (the deadlines' timer): unless something else ended it first.
func (s *qconn) abort(pc *pendingCall) {
	if s.take(pc.id) == nil {
		return
	}
	pc.st.unqueue(pc)
	pc.done(nil, fmt.Errorf("%w: deadline timer", ErrInternal))
}

// take removes a call from the pending map and from its stream's count.
func (s *qconn) take(id uint64) *pendingCall {
	pc := s.pending.take(id)
	if pc != nil {
		pc.st.callDone()
	}
	return pc
}

// Pending identifies a started call, to cancel it.
type Pending struct {
	s  *qconn
	id uint64
	pc *poolCall // set for calls started through a Pool
}

// Cancel forgets the call: a late response is dropped quietly. It reports
// whether the call was still pending (if true, done will not be called).
func (p Pending) Cancel() bool {
	if p.pc != nil {
		return p.pc.cancel()
	}
	if p.s == nil {
		return false
	}
	pc := p.s.take(p.id)
	if pc == nil {
		return false
	}
	pc.st.unqueue(pc)
	p.s.deadlines.remove(pc)
	// A caller giving up at the deadline (Unary's context fires with the
	// timer) is a timeout: the stream may be stuck.
	if !pc.deadline.IsZero() && !p.s.c.now().Before(pc.deadline) {
		pc.st.checkStuck(p.id)
	}
	return true
}

type pendingCall struct {
	id       uint64
	done     Done
	st       *cstream      // the stream the request went on
	deadline time.Time     // zero: none
	wait     time.Duration // the deadline, from the start, for the error
	hidx     int           // index in its deadlines heap, or hidxNew, hidxDone; under that shard's lock
	// Under st.mu: the request's frame while it waits in the stream's
	// send queue, and whether the call ended unanswered (its frame is
	// then not to be sent).
	queued *queuedFrame
	ended  bool
}

const pendingShards = 64

// pendingMap maps request ids to calls. Ids are sequential, so consecutive
// calls land on different shards and rarely contend for a lock.
type pendingMap struct {
	shards [pendingShards]struct {
		mu     sync.Mutex
		m      map[uint64]*pendingCall
		closed bool
		_      [40]byte // keep shards on separate cache lines
	}
}

func (p *pendingMap) init() {
	for i := range p.shards {
		p.shards[i].m = make(map[uint64]*pendingCall)
	}
}

func (p *pendingMap) store(id uint64, pc *pendingCall) bool {
	sh := &p.shards[id%pendingShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return false
	}
	sh.m[id] = pc
	return true
}

func (p *pendingMap) take(id uint64) *pendingCall {
	sh := &p.shards[id%pendingShards]
	sh.mu.Lock()
	pc := sh.m[id]
	if pc != nil {
		delete(sh.m, id)
	}
	sh.mu.Unlock()
	return pc
}

// takeWhere removes the calls that match and hands each to f, outside the
// shard's lock (f may call back into the client).
func (p *pendingMap) takeWhere(match func(*pendingCall) bool, f func(*pendingCall)) {
	var taken []*pendingCall
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.Lock()
		for id, pc := range sh.m {
			if match(pc) {
				delete(sh.m, id)
				taken = append(taken, pc)
			}
		}
		sh.mu.Unlock()
	}
	for _, pc := range taken {
		f(pc)
	}
}

func (p *pendingMap) closeAll(f func(*pendingCall)) {
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.Lock()
		sh.closed = true
		m := sh.m
		sh.m = nil
		sh.mu.Unlock()
		for _, pc := range m {
			f(pc)
		}
	}
}

// inflight counts the calls in flight (Stats).
func (c *Client) inflight() int {
	n := 0
	for _, sl := range c.slots {
		s := sl.cur.Load()
		if s == nil {
			continue
		}
		for i := range s.pending.shards {
			sh := &s.pending.shards[i]
			sh.mu.Lock()
			n += len(sh.m)
			sh.mu.Unlock()
		}
	}
	return n
}
