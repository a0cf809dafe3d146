// Package bridge is the runtime behind libffi_qrpc.so, without cgo: the
// connection table, the semantics of every command, the mapping of errors
// to statuses, the result blobs and the log lines. ffi/ (package main, the
// only cgo) decodes the C structs into Commands, hands them to a Runtime
// with a Host that delivers completions its own way (the built-in host's
// queue, or lua-resty-ffi's task answers), and encodes what comes back.
//
// Memory handed to C comes from the Memory the Runtime was made with (C's
// malloc in the library, Go memory in tests); a response is copied into it
// once, straight from the frame qrpc read.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/metrics"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// defaultCallTimeout is the deadline of a UNARY whose timeout_ms is 0. Go
// enforces every call's deadline because lua-resty-ffi's yield has no
// timeout of its own: without one a lost response would park the Lua
// coroutine forever.
const defaultCallTimeout = 60 * time.Second

// Memory is where completions' data lives: it belongs to the receiver once
// handed out.
type Memory interface {
	// Alloc returns n bytes (n may be 0), or nil when memory is exhausted.
	Alloc(n int) unsafe.Pointer
	Free(p unsafe.Pointer)
}

// Completion is a finished command on its way to a host. Its layout is
// qrpc_completion_t's (ffi/ checks it), so the built-in host's drain
// writes the caller's array directly. Data comes from the Runtime's Memory
// and belongs to whoever holds the value.
type Completion struct {
	CallID uint64
	Handle uint64 // CONNECT: the new connection
	Status int32
	Code   uint32 // StatusLog: the nginx log level
	Data   unsafe.Pointer
	Len    uintptr
}

// Stats are a connection's or the runtime's counters, laid out as
// qrpc_stats_t (ffi/ checks it): qrpc_stats copies it out.
type Stats struct {
	Inflight   uint64 // calls sent and not yet finished
	Calls      uint64 // unary calls started
	Events     uint64 // events sent
	Dropped    uint64 // events refused ("queue full")
	Reconnects uint64 // connections re-established
	Queued     uint64 // completions waiting in the host
}

// Host is what a command needs from the host that submitted it.
type Host interface {
	// Gen is the host's current lifetime, or an error saying why it is
	// not open.
	Gen() (*Gen, error)
	// Calls is the table CANCEL looks call ids up in; nil when the host's
	// calls cannot be cancelled.
	Calls() *Calls
	// Complete receives the outcome of a command that Submit answered
	// StatusPending: exactly once, on any goroutine.
	Complete(Completion)
}

// Gen is one lifetime of a host (the built-in host between qrpc_init and
// qrpc_shutdown, or one libffi_init). Connections belong to the lifetime
// that dialled them and are closed with it.
type Gen struct {
	ctx    context.Context
	cancel context.CancelFunc
	alive  atomic.Bool
}

// NewGen starts a lifetime.
func NewGen() *Gen {
	g := &Gen{}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.alive.Store(true)
	return g
}

// conn is one entry of the handle table.
type conn struct {
	r      *Runtime
	handle uint64
	addr   string
	client *qrpc.Pool
	owner  *Gen
	host   atomic.Value // Host: the host that dialled it (shared pools ask it for steps)

	inflight atomic.Int64
	calls    atomic.Uint64
	events   atomic.Uint64
	dropped  atomic.Uint64
}

// Runtime is the one runtime of a process (= nginx worker): the handle
// table and the counters, shared by both hosts.
type Runtime struct {
	mem Memory

	connMu     sync.Mutex                       // serialises writers of conns
	conns      atomic.Pointer[map[uint64]*conn] // copy-on-write: lookups take no lock
	lastHandle atomic.Uint64                    // handles are never reused

	inflight         atomic.Int64
	calls            atomic.Uint64
	events           atomic.Uint64
	dropped          atomic.Uint64
	closedReconnects atomic.Uint64 // reconnects of connections since closed

	logLevel atomic.Int64
	logger   *slog.Logger

	metrics    *metrics.Registry
	metricsOff atomic.Bool // CONFIGURE metrics=off: pools dialled from now on are not recorded
}

// New makes a runtime that hands out memory from mem and sends its log
// lines to sink (see LogSink).
func New(mem Memory, sink LogSink) *Runtime {
	r := &Runtime{mem: mem, metrics: metrics.New()}
	r.logLevel.Store(int64(slog.LevelInfo))
	r.logger = slog.New(&logHandler{level: &r.logLevel, sink: sink})
	m := map[uint64]*conn{}
	r.conns.Store(&m)
	// A process has one runtime (tests make more: the last one's log
	// hears of panics).
	safego.SetReporter(r.reportPanic)
	return r
}

// Logger is the runtime's logger; its lines reach nginx's error log.
func (r *Runtime) Logger() *slog.Logger { return r.logger }

// SetLogLevel sets the lowest level that is formatted at all.
func (r *Runtime) SetLogLevel(l slog.Level) { r.logLevel.Store(int64(l)) }

// Submit runs one command for a host. It never blocks: CONNECT dials on a
// goroutine, UNARY is encoded and queued on the calling thread. It returns
// StatusOK when the command is done (EVENT, CLOSE, CANCEL), StatusPending
// when h.Complete will be called once with the outcome, or an error status
// and message (then h.Complete is not called).
func (r *Runtime) Submit(h Host, cmd *Command) (int32, string) {
	if err := cmd.Check(); err != nil {
		return StatusOf(err)
	}
	if cmd.Op == OpPoolShare {
		return r.PoolShareAsync(h, cmd)
	}
	if cmd.Op > lastSubmitOp {
		return ErrBadArg, fmt.Sprintf("bad command: op %d is a query: use qrpc_query", cmd.Op)
	}
	g, err := h.Gen()
	if err != nil {
		return ErrClosed, err.Error()
	}
	hook("submit")
	switch cmd.Op {
	case OpConnect:
		return r.connect(h, g, cmd)
	case OpUnary:
		return r.unary(h, cmd)
	case OpEvent:
		return StatusOf(r.event(cmd))
	case OpClose:
		return StatusOf(r.closeConn(cmd.Conn))
	case OpCancel:
		if calls := h.Calls(); calls != nil {
			calls.cancel(cmd.CallID)
		}
		return StatusOK, ""
	case OpEcho:
		out := r.Result(0, nil, cmd.Body)
		out.CallID = cmd.CallID
		h.Complete(out)
		return StatusPending, ""
	}
	return ErrBadArg, fmt.Sprintf("bad command: unknown op %d", cmd.Op)
}

// connect dials on a goroutine (the handshake blocks) and completes with
// the new handle.
func (r *Runtime) connect(h Host, g *Gen, cmd *Command) (int32, string) {
	addr, cfg, err := connectConfig(cmd, r.logger)
	if err != nil {
		return StatusOf(err)
	}
	id := cmd.CallID
	// The connect goroutine (and its onPanic, on the same goroutine) is
	// the only one to complete; a completion counts once the host's
	// Complete has returned: one that panicked is taken as not delivered.
	delivered := false
	complete := func(out Completion) {
		out.CallID = id
		h.Complete(out)
		delivered = true
	}
	var made *conn // dialled, its handle not yet delivered
	safego.Go("connect", func() {
		safego.Inject("connect")
		c, err := r.dial(g, addr, cfg)
		if err != nil {
			complete(r.errCompletion(err))
			return
		}
		c.host.Store(hostBox{h})
		made = c
		hook("connect after success")
		complete(Completion{Status: StatusOK, Handle: c.handle})
	}, func() {
		if delivered {
			return
		}
		// A connection dialled and not handed over is closed: no one
		// else knows its handle, and left in the table it would live
		// (and count) until the owner's end. The caller hears of the
		// panic.
		if made != nil {
			_ = r.closeConn(made.handle)
		}
		complete(r.Message(ErrGeneric, "internal error", 0))
	})
	return StatusPending, ""
}

// unaryCall is one UNARY from Submit to its completion. Whichever way it
// ends (its outcome, Start's refusal, a panic while it was being
// started) settle runs once: the in-flight counts it added are given
// back and its call id leaves the host's table; only the first way
// delivers.
type unaryCall struct {
	r     *Runtime
	c     *conn
	h     Host
	calls *Calls
	entry callEntry // in calls (when the host has a table) until settled
	rt    *responseType
	id    uint64
	ended atomic.Bool
}

func (u *unaryCall) settle() bool {
	if !u.ended.CompareAndSwap(false, true) {
		return false
	}
	if u.c != nil {
		u.c.inflight.Add(-1)
		u.r.inflight.Add(-1)
	}
	if u.calls != nil {
		u.calls.remove(u.id, &u.entry)
	}
	return true
}

// done is the call's qrpc callback: on a qrpc goroutine, which
// safego.Recover keeps alive should the host's Complete panic.
func (u *unaryCall) done(resp *qrpc.Response, attempts int, err error) {
	defer safego.Recover("complete", nil)
	if !u.settle() {
		return
	}
	r := u.r
	var out Completion
	if u.rt != nil {
		out = r.decodedOutcome(u.rt, resp, err)
	} else {
		out = r.outcome(resp, err)
	}
	SetAttempts(out, attempts)
	out.CallID = u.id
	u.h.Complete(out)
}

// unary starts a call on the calling thread: qrpc.Client.Start encodes and
// queues the frame without blocking and without a goroutine hop. The
// outcome reaches h.Complete exactly once, on the goroutine that read the
// response (or timed the call out), unless CANCEL stops the call first.
// A panic while the call is being started is the caller's "internal
// error" (the call settles: nothing stays counted) unless the call had
// already been answered.
func (r *Runtime) unary(h Host, cmd *Command) (st int32, msg string) {
	u := &unaryCall{r: r, h: h, calls: h.Calls(), id: cmd.CallID}
	if u.calls != nil {
		if !u.calls.insert(u.id, &u.entry) {
			return ErrBadArg, fmt.Sprintf("bad command: call_id %d is already in flight", u.id)
		}
	}
	defer safego.Recover("submitter", func() {
		st, msg = StatusPending, ""
		if u.settle() {
			st, msg = ErrGeneric, "internal error"
		}
	})
	p, err := r.startUnary(cmd, u)
	if err != nil {
		u.settle()
		return StatusOf(err)
	}
	if u.calls != nil {
		u.calls.started(u.id, &u.entry, p, u.c)
	}
	return StatusPending, ""
}

func (r *Runtime) startUnary(cmd *Command, u *unaryCall) (qrpc.Pending, error) {
	c := r.lookup(cmd.Conn)
	if c == nil {
		return qrpc.Pending{}, qrpc.ErrClosed
	}
	hp := hdrPool.Get().(*[][]byte)
	defer putHeaders(hp)
	hdrs, err := ParseHeaders(cmd.Hdrs, cmd.NHdrs, (*hp)[:0])
	*hp = hdrs
	if err != nil {
		return qrpc.Pending{}, err
	}
	timeout := defaultCallTimeout
	if cmd.TimeoutMS > 0 {
		timeout = time.Duration(cmd.TimeoutMS) * time.Millisecond
	}
	if u.rt, err = responseTypeOf(cmd); err != nil {
		return qrpc.Pending{}, err
	}
	body, release, err := requestBody(cmd)
	if err != nil {
		return qrpc.Pending{}, err
	}
	defer release()
	call := qrpc.Call{Method: cmd.Method, Headers: hdrs, Body: body, Deadline: time.Now().Add(timeout),
		HashKey: cmd.HashKey, Retries: callRetries(cmd.Retries)}
	if len(cmd.Opts) > 0 {
		if err := callOpts(cmd.Opts, &call); err != nil {
			return qrpc.Pending{}, err
		}
	}
	// Counted before Start: the answer can come before Start returns.
	// From here every way out settles u once (unary, done).
	u.c = c
	c.inflight.Add(1)
	r.inflight.Add(1)
	safego.Inject("submitter")
	p, err := c.client.StartAttempts(&call, u.done)
	if err != nil {
		return qrpc.Pending{}, err
	}
	c.calls.Add(1)
	r.calls.Add(1)
	return p, nil
}

// outcome turns a response into its completion. It runs on qrpc's
// goroutines, where a panic would kill the process: recover into an error.
func (r *Runtime) outcome(resp *qrpc.Response, err error) (out Completion) {
	defer safego.Recover("complete", func() {
		out = r.Message(ErrGeneric, "internal error", 0)
	})
	hook("complete")
	if err != nil {
		return r.errCompletion(err)
	}
	return r.Result(resp.Code, resp.Headers, resp.Body)
}

// Result builds a result blob in the runtime's Memory: this is the one
// copy of a response from Go memory to C memory.
func (r *Runtime) Result(code uint32, hdrs [][]byte, body []byte) Completion {
	n := ResultSize(hdrs, body)
	p := r.mem.Alloc(n)
	if p == nil {
		return r.Message(ErrGeneric, "out of memory", 0)
	}
	WriteResult(Bytes(p, n), code, hdrs, body)
	return Completion{Status: StatusOK, Data: p, Len: uintptr(n)}
}

// Message is a completion whose data is msg, NUL-terminated (Len excludes
// the NUL), for errors and log lines. Data is nil if memory is exhausted.
func (r *Runtime) Message(status int32, msg string, callID uint64) Completion {
	c := Completion{CallID: callID, Status: status}
	p := r.mem.Alloc(len(msg) + 1)
	if p == nil {
		return c
	}
	b := Bytes(p, len(msg)+1)
	copy(b, msg)
	b[len(msg)] = 0
	c.Data, c.Len = p, uintptr(len(msg))
	return c
}

func (r *Runtime) errCompletion(err error) Completion {
	st, msg := StatusOf(err)
	return r.Message(st, msg, 0)
}

// Free releases c's data (nil is fine) and clears it.
func (r *Runtime) Free(c *Completion) {
	r.mem.Free(c.Data)
	c.Data, c.Len = nil, 0
}

// Bytes views n bytes at p.
func Bytes(p unsafe.Pointer, n int) []byte { return unsafe.Slice((*byte)(p), n) }

// cancel forgets a started call; its callback will not run if it returns
// true.
func (c *conn) cancel(p qrpc.Pending) bool {
	if !p.Cancel() {
		return false
	}
	c.inflight.Add(-1)
	c.r.inflight.Add(-1)
	return true
}

// event sends a one-way event; it never waits.
func (r *Runtime) event(cmd *Command) error {
	c := r.lookup(cmd.Conn)
	if c == nil {
		return qrpc.ErrClosed
	}
	hp := hdrPool.Get().(*[][]byte)
	defer putHeaders(hp)
	hdrs, err := ParseHeaders(cmd.Hdrs, cmd.NHdrs, (*hp)[:0])
	*hp = hdrs
	if err != nil {
		return err
	}
	body, release, err := requestBody(cmd)
	if err != nil {
		return err
	}
	defer release()
	err = c.client.SendEvent(&qrpc.Call{Method: cmd.Method, Headers: hdrs, Body: body, HashKey: cmd.HashKey})
	switch {
	case err == nil:
		c.events.Add(1)
		r.events.Add(1)
	case errors.Is(err, qrpc.ErrQueueFull):
		c.dropped.Add(1)
		r.dropped.Add(1)
	}
	return err
}

// Stats returns the counters of one connection, or with h == 0 of the
// whole runtime; queued is the host's completion queue length.
func (r *Runtime) Stats(h uint64, queued int) (Stats, error) {
	s := Stats{Queued: uint64(queued)}
	if h != 0 {
		c := r.lookup(h)
		if c == nil {
			return s, qrpc.ErrClosed
		}
		s.Inflight = uint64(max(c.inflight.Load(), 0))
		s.Calls, s.Events, s.Dropped = c.calls.Load(), c.events.Load(), c.dropped.Load()
		s.Reconnects = c.client.Stats().Reconnects
		return s, nil
	}
	s.Inflight = uint64(max(r.inflight.Load(), 0))
	s.Calls, s.Events, s.Dropped = r.calls.Load(), r.events.Load(), r.dropped.Load()
	s.Reconnects = r.closedReconnects.Load()
	for _, c := range *r.conns.Load() {
		s.Reconnects += c.client.Stats().Reconnects
	}
	return s, nil
}

// hdrPool recycles the [][]byte that views a command's header block.
// qrpc.Client.Start copies headers before returning, so the slice is free
// again right after.
var hdrPool = sync.Pool{New: func() any { s := make([][]byte, 0, 16); return &s }}

func putHeaders(hp *[][]byte) {
	if cap(*hp) > 1024 {
		return
	}
	clear(*hp) // drop the views of C memory
	*hp = (*hp)[:0]
	hdrPool.Put(hp)
}
