package qrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
)

// maxQueued bounds the bytes waiting on one stream for flow-control credit.
const maxQueued = 16 << 20

// errStreamGone: the stream picked for a frame broke before the frame was
// written; another stream may take it.
var errStreamGone = errors.New("qrpc: stream unavailable")

// DefaultStreamBatch is Config.StreamBatch's default.
const DefaultStreamBatch = 16

// bigFrame: frames of this size or more fill datagrams on their own; they
// take the streams one at a time (see Config.StreamBatch).
const bigFrame = 16 << 10

// pick returns a stream in service for a frame of size bytes, or nil when
// every one is being replaced. A suspect stream (a call on it timed out
// with no answer since) is taken only when no other stream is in service:
// it may be the reference server's hole (see checkStuck), and calls sent
// into it while it is suspect would wait for their deadlines.
func (s *qconn) pick(size int) *cstream {
	n := uint32(len(s.streams))
	var start uint32
	if size >= bigFrame {
		start = s.rrBig.Add(1)
	} else {
		start = s.rr.Add(1) / uint32(s.c.cfg.StreamBatch)
	}
	var suspect *cstream
	for i := uint32(0); i < n; i++ {
		st := s.streams[(start+i)%n].Load()
		if st == nil || st.retired.Load() {
			continue
		}
		if st.stuckSince.Load() != 0 {
			if suspect == nil {
				suspect = st
			}
			continue
		}
		return st
	}
	return suspect
}

// mayAbandon: st may be given up, now that its last call ended, for a
// partial answer nobody waits for. The connection's last stream in
// service is kept the first time: a call made next (a retry of the one
// that timed out) would find no stream while its replacement opens, and
// fail at once; it waits behind the frame instead, and is answered when
// the frame ends. If the frame is still unfinished when that call ends
// too (a server that never finishes it), the stream goes: kept for good,
// it would take every later call and answer none.
func (st *cstream) mayAbandon() bool {
	if st.sess.otherInService(st) {
		return true
	}
	return !st.kept.CompareAndSwap(false, true)
}

// otherInService: a stream other than st takes calls.
func (s *qconn) otherInService(st *cstream) bool {
	for i := range s.streams {
		if o := s.streams[i].Load(); o != nil && o != st && !o.retired.Load() {
			return true
		}
	}
	return false
}

func (s *qconn) start(call *Call, done Done) (Pending, error) {
	id := s.nextID.Add(1)
	if id == 0 { // 0 marks events
		id = s.nextID.Add(1)
	}
	req := Request{RequestId: id, Method: call.Method, Headers: call.Headers, Body: call.Body}
	buf, err := s.encode(frame.KindRequest, &req)
	if err != nil {
		return Pending{}, err
	}
	// A stream that broke under us had not taken the frame: try another.
	for range len(s.streams) {
		st := s.pick(len(*buf))
		if st == nil {
			break
		}
		pc := &pendingCall{id: id, done: done, st: st, deadline: call.Deadline, hidx: hidxNew}
		st.inflight.Add(1)
		if !s.pending.store(id, pc) {
			// The qconn failed since it was picked (closeAll ran, after
			// fail had set err and refusal).
			st.callDone()
			s.c.codec.PutBuffer(buf)
			if s.refusal != nil {
				// Not sent: a pool tries another server (neverSent).
				return Pending{}, fmt.Errorf("%w: %w", ErrUnavailable, s.refusal)
			}
			return Pending{}, fmt.Errorf("%w: %v", ErrUnavailable, s.err)
		}
		if !s.probing.Load() {
			s.startProbing()
		}
		// Timed only once the call is in the map: a deadline that passed
		// before would find nothing to take, and the call would never time
		// out. A response that comes first has removed it for good, and
		// add then does nothing.
		if !call.Deadline.IsZero() {
			pc.wait = time.Until(call.Deadline)
			s.deadlines.add(pc)
		}
		err := st.write(buf, pc)
		if err == nil {
			return Pending{s: s, id: id}, nil
		}
		pc = s.take(id)
		if pc == nil {
			// The qconn or stream failed concurrently and has already
			// called done.
			return Pending{s: s, id: id}, nil
		}
		s.deadlines.remove(pc)
		if !errors.Is(err, errStreamGone) {
			return Pending{}, err
		}
	}
	s.c.codec.PutBuffer(buf)
	return Pending{}, fmt.Errorf("%w: no stream in service", ErrUnavailable)
}

// send encodes a request or event and writes it without blocking.
func (s *qconn) send(k frame.Kind, req *Request) error {
	buf, err := s.encode(k, req)
	if err != nil {
		return err
	}
	for range len(s.streams) {
		st := s.pick(len(*buf))
		if st == nil {
			break
		}
		if err := st.write(buf, nil); !errors.Is(err, errStreamGone) {
			return err
		}
	}
	s.c.codec.PutBuffer(buf)
	return fmt.Errorf("%w: no stream in service", ErrUnavailable)
}

func (s *qconn) encode(k frame.Kind, req *Request) (*[]byte, error) {
	codec := s.c.codec
	buf := codec.GetBuffer()
	b, err := codec.AppendRequest((*buf)[:0], k, req)
	if err != nil {
		codec.PutBuffer(buf)
		if errors.Is(err, frame.ErrMessageTooLarge) {
			return nil, fmt.Errorf("%w: %v", ErrTooLarge, err)
		}
		return nil, err
	}
	if len(b) > maxQueued {
		// No stream could ever queue it: every server would refuse it, so
		// it is refused here, as one over the frame limit is.
		codec.PutBuffer(buf)
		return nil, fmt.Errorf("%w: frame of %d bytes is over a stream's send queue (%d bytes)", ErrTooLarge, len(b), maxQueued)
	}
	*buf = b
	return buf, nil
}

// cstream is one client-side bidirectional stream.
type cstream struct {
	sess *qconn
	s    *quic.Stream
	idx  int // position in sess.streams

	// retired: out of service (broken, or stuck and replaced); it takes no
	// new frames. inflight counts its pending calls, so that a stuck
	// stream is cancelled once the last of them has ended.
	retired      atomic.Bool
	inflight     atomic.Int64
	lastAnswered atomic.Uint64
	// stuckSince is the id of a call of this stream that timed out with no
	// answer on the stream since: the stream is suspect until it answers
	// something, and stuck once another stream answers a later call.
	stuckSince atomic.Uint64
	cancelOnce sync.Once
	fr         atomic.Pointer[frame.Reader] // set while the reader runs
	abandoned  atomic.Bool                  // see abandon
	// kept: the stream was the connection's last in service when its
	// partial answer was first left to nobody, and was kept (see
	// otherInService); the next time it is given up all the same.
	kept atomic.Bool

	mu       sync.Mutex
	queue    []*queuedFrame // frames waiting for flow-control credit, in order
	queued   int            // bytes in queue
	dropped  int            // entries of queue whose call ended unanswered (buf nil)
	flushing bool
	closing  bool          // finish was called: no more writes
	eof      chan struct{} // closed when the server has closed its side
}

func newCstream(s *qconn, qs *quic.Stream, idx int) *cstream {
	return &cstream{sess: s, s: qs, idx: idx, eof: make(chan struct{})}
}

// finish closes the send side once the queue is flushed.
func (st *cstream) finish() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closing {
		return
	}
	st.closing = true
	if !st.flushing {
		_ = st.s.Close()
	}
}

// queuedFrame is a frame in a stream's send queue; buf is nil once the
// writer took it or its call ended unanswered.
type queuedFrame struct {
	buf *[]byte
}

// unqueue drops the frame of a call that ended unanswered (timeout,
// cancel) from the send queue if the writer has not taken it yet: a
// server that reads slowly or not at all must not get, later, a request
// whose caller was told it timed out, and the bytes must not wait for it.
// A frame the writer took is in quic-go's hands and goes out whole.
func (st *cstream) unqueue(pc *pendingCall) {
	st.mu.Lock()
	defer st.mu.Unlock()
	pc.ended = true
	qf := pc.queued
	pc.queued = nil
	if qf == nil || qf.buf == nil {
		return
	}
	st.queued -= len(*qf.buf)
	st.sess.c.codec.PutBuffer(qf.buf)
	qf.buf = nil
	st.dropped++
	if st.dropped > len(st.queue)/2 {
		// Compact: a never-read stream keeps taking frames of calls that
		// then time out, and the dropped entries must not pile up.
		q := st.queue[:0]
		for _, f := range st.queue {
			if f.buf != nil {
				q = append(q, f)
			}
		}
		clear(st.queue[len(q):])
		st.queue, st.dropped = q, 0
	}
}

// write sends one encoded frame, the request of pc (nil for an event).
// The fast path queues it in quic-go without blocking; otherwise a
// flusher goroutine writes it when flow control allows, preserving order.
// It takes ownership of buf unless it returns errStreamGone (the stream
// was out of service: buf is the caller's to send elsewhere).
func (st *cstream) write(buf *[]byte, pc *pendingCall) error {
	s := st.sess
	codec := s.c.codec
	st.mu.Lock()
	if pc != nil && pc.ended {
		// The call timed out or was cancelled between being stored and
		// now: its request is not sent.
		st.mu.Unlock()
		codec.PutBuffer(buf)
		return nil
	}
	if st.closing {
		st.mu.Unlock()
		codec.PutBuffer(buf)
		return ErrClosed
	}
	if st.retired.Load() {
		st.mu.Unlock()
		return errStreamGone
	}
	if !st.flushing {
		err := st.s.TryWriteAll(*buf)
		if err == nil {
			st.mu.Unlock()
			s.c.obs.BytesSent(len(*buf))
			codec.PutBuffer(buf)
			return nil
		}
		if !errors.Is(err, quic.ErrWouldBlock) {
			st.mu.Unlock()
			if !s.connLevel(err) {
				// Nothing of this frame was taken (TryWriteAll is all or
				// nothing): it can go on another stream.
				st.broken(fmt.Errorf("write: %w", err))
				return errStreamGone
			}
			codec.PutBuffer(buf)
			// Not on this goroutine: failing the qconn calls done of the
			// calls in flight, and the caller of Start (a Pool) may hold a
			// lock that done takes.
			s.c.wg.Add(1)
			safego.Go("connection fail", func() {
				defer s.c.wg.Done()
				s.fail(fmt.Errorf("write: %w", err))
			}, nil)
			if refusedBy(err) {
				// TryWriteAll took nothing: not sent (neverSent).
				return fmt.Errorf("%w: %w", ErrUnavailable, classifyDialError(s.c.addr, err))
			}
			return fmt.Errorf("%w: write: %v", ErrConnLost, err)
		}
	}
	if st.queued+len(*buf) > maxQueued {
		st.mu.Unlock()
		codec.PutBuffer(buf)
		return ErrQueueFull
	}
	qf := &queuedFrame{buf: buf}
	if pc != nil {
		pc.queued = qf
	}
	st.queue = append(st.queue, qf)
	st.queued += len(*buf)
	if !st.flushing {
		st.flushing = true
		s.c.wg.Add(1)
		safego.Go("stream writer", st.flushLoop, nil)
	}
	st.mu.Unlock()
	return nil
}

// flushLoop is the writer goroutine: flush, and after a panic in it the
// stream's end (writerPanicked) before the client's wait group hears of
// it.
func (st *cstream) flushLoop() {
	defer st.sess.c.wg.Done()
	safego.Run("stream writer", st.flush, st.writerPanicked)
}

// writerPanicked: the frames the writer held are lost, and with them the
// calls they carried; which those are is not known, so the stream goes
// out of service and every call on it fails with ErrInternal.
func (st *cstream) writerPanicked() {
	st.mu.Lock()
	st.dropQueue()
	st.flushing = false
	st.mu.Unlock()
	st.retire(fmt.Errorf("%w: stream writer", ErrInternal))
}

// dropQueue frees the frames still queued; under st.mu.
func (st *cstream) dropQueue() {
	for _, qf := range st.queue {
		if qf.buf != nil {
			st.sess.c.codec.PutBuffer(qf.buf)
			qf.buf = nil
		}
	}
	st.queue, st.queued, st.dropped = nil, 0, 0
}

func (st *cstream) flush() {
	s := st.sess
	codec := s.c.codec
	for {
		st.mu.Lock()
		if len(st.queue) == 0 {
			st.flushing = false
			if st.closing {
				_ = st.s.Close()
			}
			st.mu.Unlock()
			return
		}
		qf := st.queue[0]
		st.queue[0] = nil
		st.queue = st.queue[1:]
		buf := qf.buf
		if buf == nil { // its call ended unanswered
			st.dropped--
			st.mu.Unlock()
			continue
		}
		qf.buf = nil
		st.queued -= len(*buf)
		st.mu.Unlock()
		safego.Inject("stream writer")
		n, err := st.s.Write(*buf)
		codec.PutBuffer(buf)
		if n > 0 {
			s.c.obs.BytesSent(n)
		}
		if err != nil {
			if s.connLevel(err) {
				s.fail(fmt.Errorf("write: %w", err))
			} else {
				st.broken(fmt.Errorf("write: %w", err))
			}
			st.mu.Lock()
			st.dropQueue()
			st.flushing = false
			st.mu.Unlock()
			return
		}
	}
}

// broken takes a stream the server reset (or ended) out of service: its
// calls fail (they may have run), the stream is cancelled both ways and a
// new one takes its place. The connection and its other streams go on.
func (st *cstream) broken(cause error) {
	st.retire(fmt.Errorf("%w: stream: %v", ErrConnLost, cause))
}

// retire takes the stream out of service, fails its calls with err,
// cancels it and opens another in its place.
func (st *cstream) retire(err error) {
	s := st.sess
	if since := st.stuckSince.Swap(0); since != 0 {
		s.suspects.Add(-1)
	}
	if !st.retired.CompareAndSwap(false, true) {
		return
	}
	s.c.cfg.Logger.Debug("qrpc stream broken, reopening", "addr", s.c.addr, "err", err)
	// The calls fail on a goroutine of their own: retire may run inside
	// Start (a write that found the stream reset), whose caller may hold a
	// lock that done takes. Each call's end is apart: a panic in one's
	// done leaves the others theirs.
	s.c.wg.Add(1)
	safego.Go("stream retire", func() {
		defer s.c.wg.Done()
		s.pending.takeWhere(func(pc *pendingCall) bool { return pc.st == st }, func(pc *pendingCall) {
			st.inflight.Add(-1)
			endCall("stream retire", pc, err, func() { s.deadlines.remove(pc) })
		})
	}, nil)
	st.cancel()
	s.replace(st)
}

func (st *cstream) cancel() {
	st.cancelOnce.Do(func() {
		st.s.CancelRead(0)
		st.s.CancelWrite(0)
	})
}

// replace opens a stream to take old's place, in the background (opening
// may wait for the server's stream credit). An open that fails is tried
// again with backoff while the connection lives: a connection whose
// server is slow to give credit back would otherwise lose the stream's
// place for good.
func (s *qconn) replace(old *cstream) {
	c := s.c
	c.wg.Add(1)
	safego.Go("stream reopen", func() {
		defer c.wg.Done()
		attempt := 0
		// A panic while reopening starts the loop again (after the
		// backoff): the stream's place must not stay empty.
		for safego.Run("stream reopen", func() { s.reopen(old, &attempt) }, func() { attempt++ }) {
		}
	}, nil)
}

// reopen is replace's loop: it returns when a stream has taken old's
// place or the connection is gone.
func (s *qconn) reopen(old *cstream, attempt *int) {
	c := s.c
	for ; ; *attempt++ {
		if *attempt > 0 {
			wake := make(chan struct{})
			t := c.clk.AfterFunc(c.backoff(*attempt-1), safego.Func("stream reopen", func() { close(wake) }, nil))
			select {
			case <-wake:
			case <-s.conn.Context().Done():
				t.Stop()
				return // the qconn's own end takes care of the rest
			case <-c.ctx.Done():
				t.Stop()
				return
			}
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
		qs, err := s.conn.OpenStreamSync(ctx)
		cancel()
		if err == nil {
			ns := newCstream(s, qs, old.idx)
			c.wg.Add(1)
			safego.Go("stream reader", ns.readLoop, nil)
			s.streams[old.idx].Store(ns)
			if *attempt > 0 {
				c.cfg.Logger.Info("qrpc stream reopened", "addr", c.addr, "attempt", *attempt+1)
			}
			return
		}
		if s.conn.Context().Err() != nil || c.ctx.Err() != nil {
			return // the qconn's own end takes care of the rest
		}
		if s.pick(0) == nil {
			s.fail(fmt.Errorf("no stream in service: open stream: %w", err))
			return
		}
		if *attempt == 0 {
			c.cfg.Logger.Warn("qrpc cannot reopen a stream, retrying", "addr", c.addr, "err", err)
		}
	}
}

// readLoop is a stream's reader goroutine. A panic while it reads ends
// the stream (readerPanicked) before the client's wait group hears of it.
func (st *cstream) readLoop() {
	defer st.sess.c.wg.Done()
	var held *pendingCall
	safego.Run("stream reader", func() { st.read(&held) }, func() { st.readerPanicked(held) })
	st.fr.Store(nil)
	if st.abandoned.Load() {
		// Its partial frame is garbage now.
		releaseMemory(st.sess.c)
	}
}

// readerPanicked ends what the reader held: the call it had taken (not
// yet handed to done) and every other call of the stream fail with
// ErrInternal, and another stream takes this one's place. The stream is
// retired first: the held call's end (its done is the caller's) may
// panic too, and the stream must not stay in service unread.
func (st *cstream) readerPanicked(held *pendingCall) {
	err := fmt.Errorf("%w: stream reader", ErrInternal)
	safego.Run("stream reader", func() { st.retire(err) }, nil)
	if held != nil {
		endCall("stream reader", held, err, func() { st.sess.deadlines.remove(held) })
	}
}

// read reads the stream's answers until it ends. *held is the call taken
// from the pending map and not yet handed to its done.
func (st *cstream) read(held **pendingCall) {
	s := st.sess
	fr := s.c.codec.NewReader(st.s)
	// A large answer still arriving when no call of the stream waits any
	// more is for nobody: stop buffering it (see abandon).
	// The last stream in service is given up only by callDone (see
	// mayAbandon): the reader does not, between two calls.
	fr.Abandon = func() bool { return st.inflight.Load() <= 0 && s.otherInService(st) }
	st.fr.Store(fr)
	var resp Response
	for {
		// The last answer's header slice is kept for the next one only
		// when small: a large one is not pinned while the stream waits.
		if cap(resp.Headers) > keepHeaders {
			resp.Headers = nil
		}
		kind, payload, err := fr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				st.mu.Lock()
				closing := st.closing
				st.mu.Unlock()
				if closing { // the answer to finish(): all read
					close(st.eof)
					return
				}
			}
			if errors.Is(err, frame.ErrAbandoned) {
				// The reader ends here: a call written on the stream since
				// it gave the frame up would wait for an answer nobody
				// reads, so retire fails it (abandon would leave it).
				st.abandoned.Store(true)
				st.retire(fmt.Errorf("%w: stream: %v", ErrConnLost, err))
				return
			}
			if errors.Is(err, frame.ErrFrameTooLarge) || errors.Is(err, frame.ErrUnknownFlag) ||
				errors.Is(err, frame.ErrTooLarge) || errors.Is(err, frame.ErrBadCompression) ||
				errors.Is(err, frame.ErrBadLength) {
				s.fail(fmt.Errorf("%w: %v", ErrProtocol, err))
				return
			}
			if s.connLevel(err) {
				s.fail(err)
				return
			}
			var se *quic.StreamError
			if errors.As(err, &se) && !se.Remote && st.retired.Load() {
				return // our own cancel of a retired stream
			}
			st.broken(err)
			return
		}
		if st.kept.Load() {
			st.kept.Store(false) // the frame it was kept for has ended
		}
		if kind != frame.KindResponse {
			s.fail(fmt.Errorf("%w: server sent a frame of kind %d", ErrProtocol, kind))
			return
		}
		s.c.obs.BytesReceived(len(payload) + frame.HeaderSize)
		if err := checkResponseHeaders(payload); err != nil {
			s.fail(err)
			return
		}
		// Reset every field (unknown ones too, or they would pile up) but
		// keep the headers' (small) backing array.
		resp = Response{Headers: resp.Headers[:0]}
		// Unsafe: fields alias payload, which stays valid until Next is called
		// again, i.e. for the whole of done().
		if err := resp.UnmarshalVTUnsafe(payload); err != nil {
			s.fail(fmt.Errorf("%w: bad response: %v", ErrProtocol, err))
			return
		}
		resp.Headers = evenHeaders(resp.Headers)
		st.answered(resp.RequestId)
		pc := s.take(resp.RequestId)
		if pc == nil {
			continue // cancelled or timed out: drop quietly
		}
		*held = pc
		safego.Inject("stream reader")
		s.deadlines.remove(pc)
		*held = nil // from here done owns the call
		// Under load the deadline's timer can run late, after the response
		// is read: a response past the deadline is still a timeout.
		if !pc.deadline.IsZero() {
			if late := s.c.now().Sub(pc.deadline); late >= 0 {
				pc.done(nil, fmt.Errorf("%w: response came %v after the deadline", ErrTimeout, late))
				continue
			}
		}
		pc.done(&resp, nil)
	}
}
