package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// defaultCallTimeout is the deadline of a UNARY whose timeout_ms is 0. Go
// enforces every call's deadline because lua-resty-ffi's yield has no
// timeout of its own: without one a lost response would park the Lua
// coroutine forever.
const defaultCallTimeout = 60 * time.Second

// completion is a finished command on its way to a host: the Go side of
// qrpc_completion_t. data is malloc'd and owned by whoever holds the value.
type completion struct {
	callID uint64
	handle uint64
	status int32
	code   uint32
	data   unsafe.Pointer
	n      int
}

func (c *completion) free() {
	cFree(c.data)
	c.data, c.n = nil, 0
}

// resultCompletion builds a result blob: this is the one copy of a
// response from Go memory to C memory.
func resultCompletion(code uint32, hdrs [][]byte, body []byte) completion {
	n := resultSize(hdrs, body)
	p := cMalloc(n)
	if p == nil {
		return errorCompletion(errGeneric, "out of memory")
	}
	writeResult(cBuf(p, n), code, hdrs, body)
	return completion{status: statusOK, data: p, n: n}
}

func errorCompletion(status int32, msg string) completion {
	p, n := cMessage(msg)
	return completion{status: status, data: p, n: n}
}

func errCompletion(err error) completion {
	return errorCompletion(statusOf(err))
}

// hostGen is one lifetime of a host (the built-in host between qrpc_init
// and qrpc_shutdown, or one libffi_init). Connections belong to the
// generation that dialled them and are closed with it.
type hostGen struct {
	ctx    context.Context
	cancel context.CancelFunc
	alive  atomic.Bool
}

func newGen() *hostGen {
	g := &hostGen{}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.alive.Store(true)
	return g
}

// conn is one entry of the handle table.
type conn struct {
	handle uint64
	addr   string
	client *qrpc.Client
	owner  *hostGen

	inflight atomic.Int64
	calls    atomic.Uint64
	events   atomic.Uint64
	dropped  atomic.Uint64
}

// runtimeState is the one runtime of the process (= nginx worker): the
// handle table and the counters, shared by both hosts.
type runtimeState struct {
	connMu     sync.Mutex                       // serialises writers of conns
	conns      atomic.Pointer[map[uint64]*conn] // copy-on-write: lookups take no lock
	lastHandle atomic.Uint64                    // handles are never reused

	inflight         atomic.Int64
	calls            atomic.Uint64
	events           atomic.Uint64
	dropped          atomic.Uint64
	closedReconnects atomic.Uint64 // reconnects of connections since closed

	logger *slog.Logger
}

var rt = newRuntime()

func newRuntime() *runtimeState {
	r := &runtimeState{logger: slog.New(newLogHandler())}
	m := map[uint64]*conn{}
	r.conns.Store(&m)
	return r
}

func (r *runtimeState) lookup(h uint64) *conn {
	return (*r.conns.Load())[h]
}

// add registers a dialled client, unless its owner died meanwhile (then
// the caller closes the client). Checking alive under connMu pairs with
// closeOwned: no connection can slip in after its owner's sweep.
func (r *runtimeState) add(cl *qrpc.Client, addr string, owner *hostGen) *conn {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	if !owner.alive.Load() {
		return nil
	}
	c := &conn{handle: r.lastHandle.Add(1), addr: addr, client: cl, owner: owner}
	old := *r.conns.Load()
	m := make(map[uint64]*conn, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[c.handle] = c
	r.conns.Store(&m)
	return c
}

// remove takes connections out of the table: the one with handle h, or
// (h == 0) every one owned by owner.
func (r *runtimeState) remove(h uint64, owner *hostGen) []*conn {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	old := *r.conns.Load()
	var out []*conn
	m := make(map[uint64]*conn, len(old))
	for k, v := range old {
		if (h != 0 && k == h) || (h == 0 && owner != nil && v.owner == owner) {
			out = append(out, v)
			continue
		}
		m[k] = v
	}
	if len(out) > 0 {
		r.conns.Store(&m)
	}
	return out
}

// closeClient closes a removed connection. qrpc.Client.Close waits for the
// client's goroutines, so callers on the nginx thread run it in a goroutine.
func (r *runtimeState) closeClient(c *conn) {
	defer recoverLog("close")
	_ = c.client.Close()
	r.closedReconnects.Add(c.client.Stats().Reconnects)
}

// connectConfig copies a CONNECT command into a qrpc.Config: the dial
// outlives the caller's memory.
func connectConfig(cmd *command, logger *slog.Logger) (string, *qrpc.Config) {
	cfg := &qrpc.Config{
		ServerName:         string(cmd.serverName),
		CAPEM:              clone(cmd.ca),
		CertPEM:            clone(cmd.cert),
		KeyPEM:             clone(cmd.key),
		InsecureSkipVerify: cmd.insecure,
		Conns:              int(cmd.conns),
		Streams:            int(cmd.streams),
		DialTimeout:        time.Duration(cmd.timeoutMS) * time.Millisecond,
		IdleTimeout:        time.Duration(cmd.idleTimeoutMS) * time.Millisecond,
		MaxFrameSize:       int(cmd.maxFrameSize),
		Logger:             logger,
	}
	for p := cmd.pins; len(p) >= 32; p = p[32:] {
		cfg.Pins = append(cfg.Pins, clone(p[:32]))
	}
	return string(cmd.addr), cfg
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// dial connects and registers the connection. It blocks (handshake): run it
// on its own goroutine.
func (r *runtimeState) dial(owner *hostGen, addr string, cfg *qrpc.Config) (*conn, error) {
	cl, err := qrpc.Dial(owner.ctx, addr, cfg)
	if err != nil {
		if owner.ctx.Err() != nil {
			return nil, qrpc.ErrClosed
		}
		r.logger.Info("qrpc connect failed", "addr", addr, "err", err)
		return nil, err
	}
	c := r.add(cl, addr, owner)
	if c == nil {
		_ = cl.Close()
		return nil, qrpc.ErrClosed
	}
	return c, nil
}

// startUnary starts a call on the calling thread: qrpc.Client.Start encodes
// and queues the frame without blocking and without a goroutine hop. The
// outcome reaches deliver exactly once, on the goroutine that read the
// response (or timed the call out), unless the returned Pending is
// cancelled first; on error deliver is never called.
func (r *runtimeState) startUnary(cmd *command, deliver func(completion)) (qrpc.Pending, *conn, error) {
	c := r.lookup(cmd.conn)
	if c == nil {
		return qrpc.Pending{}, nil, qrpc.ErrClosed
	}
	hp := hdrPool.Get().(*[][]byte)
	defer putHeaders(hp)
	hdrs, err := parseHeaders(cmd.hdrs, cmd.nhdrs, (*hp)[:0])
	*hp = hdrs
	if err != nil {
		return qrpc.Pending{}, nil, err
	}
	timeout := defaultCallTimeout
	if cmd.timeoutMS > 0 {
		timeout = time.Duration(cmd.timeoutMS) * time.Millisecond
	}
	call := qrpc.Call{Method: cmd.method, Headers: hdrs, Body: cmd.body, Deadline: time.Now().Add(timeout)}
	c.inflight.Add(1)
	r.inflight.Add(1)
	p, err := c.client.Start(&call, func(resp *qrpc.Response, err error) {
		defer recoverLog("complete")
		c.inflight.Add(-1)
		r.inflight.Add(-1)
		deliver(buildOutcome(resp, err))
	})
	if err != nil {
		c.inflight.Add(-1)
		r.inflight.Add(-1)
		return qrpc.Pending{}, nil, err
	}
	c.calls.Add(1)
	r.calls.Add(1)
	return p, c, nil
}

// buildOutcome turns a response into its completion. It runs on qrpc's
// goroutines, where a panic would kill the process: recover into an error.
func buildOutcome(resp *qrpc.Response, err error) (out completion) {
	defer func() {
		if p := recover(); p != nil {
			rt.logger.Error("qrpc panic while completing a call", "panic", fmt.Sprint(p))
			out = errorCompletion(errGeneric, "internal error")
		}
	}()
	if testHook != nil {
		testHook("complete")
	}
	if err != nil {
		return errCompletion(err)
	}
	return resultCompletion(resp.Code, resp.Headers, resp.Body)
}

// cancelCall forgets a started call; done will not run if it returns true.
func (r *runtimeState) cancelCall(p qrpc.Pending, c *conn) bool {
	if c == nil || !p.Cancel() {
		return false
	}
	c.inflight.Add(-1)
	r.inflight.Add(-1)
	return true
}

// event sends a one-way event; it never waits.
func (r *runtimeState) event(cmd *command) error {
	c := r.lookup(cmd.conn)
	if c == nil {
		return qrpc.ErrClosed
	}
	hp := hdrPool.Get().(*[][]byte)
	defer putHeaders(hp)
	hdrs, err := parseHeaders(cmd.hdrs, cmd.nhdrs, (*hp)[:0])
	*hp = hdrs
	if err != nil {
		return err
	}
	err = c.client.Event(cmd.method, hdrs, cmd.body)
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

// closeConn removes a connection and closes it in the background (Close
// waits for goroutines; the caller may be the nginx thread). Its pending
// calls complete with "closed".
func (r *runtimeState) closeConn(h uint64) error {
	cs := r.remove(h, nil)
	if len(cs) == 0 {
		return qrpc.ErrClosed
	}
	for _, c := range cs {
		go r.closeClient(c)
	}
	return nil
}

// stats returns the counters of one connection, or with h == 0 of the
// whole runtime; queued is the host's completion queue length.
func (r *runtimeState) stats(h uint64, queued int) (statsABI, error) {
	s := statsABI{Queued: uint64(queued)}
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

// statsCompletion wraps stats in a result blob whose body is a qrpc_stats_t.
func statsCompletion(s statsABI) completion {
	body := unsafe.Slice((*byte)(unsafe.Pointer(&s)), unsafe.Sizeof(s))
	return resultCompletion(0, nil, body)
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

// testHook, nil outside tests, lets tests panic at chosen points to check
// that the panic is recovered into an error.
var testHook func(where string)

// recoverLog is deferred at the top of every goroutine this package starts:
// a panic there would otherwise take the nginx worker down.
func recoverLog(where string) {
	if p := recover(); p != nil {
		rt.logger.Error("qrpc panic recovered", "where", where, "panic", fmt.Sprint(p))
	}
}
