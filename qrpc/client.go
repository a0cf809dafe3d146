package qrpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// Request and Response are the wire messages.
type (
	Request  = qrpcpb.Request
	Response = qrpcpb.Response
)

var errContextDeadline = context.DeadlineExceeded

// ErrQueueFull: the stream's send queue (bytes waiting for flow control)
// is over its bound; the call was not sent.
var ErrQueueFull = errors.New("qrpc: queue full")

// maxQueued bounds the bytes waiting on one stream for flow-control credit.
const maxQueued = 16 << 20

// Call is one request to start with Client.Start. Start copies everything it
// needs before returning: the caller may reuse the slices at once.
type Call struct {
	Method   []byte
	Headers  [][]byte // alternating key, value
	Body     []byte
	Deadline time.Time // zero: no deadline

	// HashKey picks the server of a Pool with Hash balancing.
	HashKey []byte
	// Retries, for a Pool: extra attempts on another server after a
	// transport failure of a call that may have run; 0 takes the pool's
	// PoolConfig.Retries, negative means none. A Client ignores it.
	Retries int
	// TryTimeout, for a Pool: each attempt's bound; 0 takes the pool's
	// PoolConfig.TryTimeout, negative means none.
	TryTimeout time.Duration
	// Hedge, for a Pool: the call's hedging; zero takes the pool's
	// PoolConfig.Hedge, Max < 0 means none.
	Hedge Hedge
}

// Done receives the outcome of a call started with Start, exactly once. It
// runs on a client goroutine and must not block. resp (when err is nil) is
// valid only until Done returns: copy what you keep.
type Done func(resp *Response, err error)

// Client is a qrpc client over one or more QUIC connections. It is safe for
// concurrent use.
type Client struct {
	addr     string
	cfg      Config
	codec    *frame.Codec
	tlsConf  *tls.Config
	quicConf *quic.Config
	slots    []*slot
	rr       atomic.Uint32

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	reconnects atomic.Uint64

	// nowFn, when set, replaces time.Now for the deadline check of
	// responses and cancels: a test moves it past a deadline whose timer
	// has not run, which makes the late-response race deterministic
	// (export_test.go).
	nowFn atomic.Pointer[func() time.Time]

	// obs and onState are the pool's view of this client (a peer of a
	// Pool); a plain Client has a no-op observer and no onState.
	obs     peerObserver
	onState func()
}

// now is time.Now, or the test's clock.
func (c *Client) now() time.Time {
	if f := c.nowFn.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

// Stats are counters of a client.
type Stats struct {
	InFlight   int    // calls started and not finished
	Reconnects uint64 // connections re-established after a loss
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{InFlight: c.inflight(), Reconnects: c.reconnects.Load()}
}

// Dial connects to addr (host:port) with cfg (nil means defaults). It returns
// once every connection is up, or the first error.
func Dial(ctx context.Context, addr string, cfg *Config) (*Client, error) {
	conf, err := cfg.populate()
	if err != nil {
		return nil, err
	}
	tlsConf, err := conf.tlsConfig(addr)
	if err != nil {
		return nil, err
	}
	c := newClient(addr, conf, tlsConf, nil, nil)
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// connect dials every connection now and starts their slots; on error
// the client is left closed.
func (c *Client) connect(ctx context.Context) error {
	qconns := make([]*qconn, 0, c.cfg.Conns)
	for i := 0; i < c.cfg.Conns; i++ {
		s, err := c.dial(ctx)
		if err != nil {
			// The connections already up go with their sockets and
			// transports: no slot owns them yet.
			for _, s := range qconns {
				s.fail(ErrClosed)
				s.release()
			}
			c.closed.Store(true)
			c.cancel()
			c.wg.Wait()
			return err
		}
		qconns = append(qconns, s)
	}
	// The slots are all in place before any slot goroutine runs: those
	// read c.slots (up, through onState) and nothing writes it after.
	slots := make([]*slot, len(qconns))
	for i, s := range qconns {
		slots[i] = &slot{c: c}
		slots[i].cur.Store(s)
	}
	c.slots = slots
	for i, s := range qconns {
		c.wg.Add(1)
		go slots[i].run(s)
	}
	return nil
}

// lastDialErr is the latest dial failure of a client that has no live
// connection, or nil.
func (c *Client) lastDialErr() error {
	if c.up() {
		return nil
	}
	for _, sl := range c.slots {
		if e := sl.lastErr.Load(); e != nil {
			return *e
		}
	}
	return nil
}

// liveConns counts the client's live QUIC connections.
func (c *Client) liveConns() int {
	n := 0
	for _, sl := range c.slots {
		if s := sl.cur.Load(); s != nil && !s.dead.Load() {
			n++
		}
	}
	return n
}

func newClient(addr string, conf Config, tlsConf *tls.Config, obs peerObserver, onState func()) *Client {
	if obs == nil {
		obs = observe.Nop{}.Peer("")
	}
	c := &Client{
		addr:     addr,
		cfg:      conf,
		codec:    frame.New(conf.MaxFrameSize),
		tlsConf:  tlsConf,
		quicConf: conf.quicConfig(),
		obs:      obs,
		onState:  onState,
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// dialBackground returns a client whose connections will be dialled (and
// re-dialled) by its slot goroutines, started by startSlots: a pool adds
// servers that may be down.
func dialBackground(addr string, conf Config, obs peerObserver, onState func()) (*Client, error) {
	tlsConf, err := conf.tlsConfig(addr)
	if err != nil {
		return nil, err
	}
	c := newClient(addr, conf, tlsConf, obs, onState)
	for i := 0; i < conf.Conns; i++ {
		sl := &slot{c: c}
		c.slots = append(c.slots, sl)
	}
	return c, nil
}

func (c *Client) startSlots() {
	for _, sl := range c.slots {
		c.wg.Add(1)
		go sl.run(nil)
	}
}

// up reports whether some connection is live (without allocating).
func (c *Client) up() bool {
	for _, sl := range c.slots {
		if s := sl.cur.Load(); s != nil && !s.dead.Load() {
			return true
		}
	}
	return false
}

func (c *Client) stateChanged() {
	if c.onState != nil {
		c.onState()
	}
}

// Addr returns the address the client dials.
func (c *Client) Addr() string { return c.addr }

func (c *Client) dial(ctx context.Context) (*qconn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	qc := c.quicConf.Clone()
	confirmed := newConfirmSignal()
	qc.TokenStore = confirmed
	raddr, err := net.ResolveUDPAddr("udp", c.addr)
	if err != nil {
		return nil, classifyDialError(c.addr, err)
	}
	sock, err := listenUDP(raddr)
	if err != nil {
		return nil, classifyDialError(c.addr, err)
	}
	tr := &quic.Transport{Conn: sock}
	fail := func(conn *quic.Conn, err error) (*qconn, error) {
		if conn != nil {
			_ = conn.CloseWithError(0, "")
		}
		closeTransport(tr, sock)
		return nil, classifyDialError(c.addr, err)
	}
	conn, err := tr.Dial(ctx, raddr, c.tlsConf, qc)
	if err != nil {
		return fail(nil, err)
	}
	if c.cfg.skipConfirmation {
		// Tests: let the server's verdict arrive after Dial, as it can
		// when the confirmation wait runs out under load.
	} else if err := awaitConfirmation(ctx, conn, confirmed.ch); err != nil {
		return fail(conn, err)
	}
	s := &qconn{c: c, conn: conn, tr: tr, sock: sock, done: make(chan struct{}), confirmed: confirmed.ch, upAt: c.now()}
	s.pending.init()
	s.deadlines.init(s.expire)
	s.nextID.Store(rand.Uint64() >> 1)
	s.streams = make([]atomic.Pointer[cstream], c.cfg.Streams)
	for i := range s.streams {
		qs, err := conn.OpenStreamSync(ctx)
		if err != nil {
			return fail(conn, fmt.Errorf("open stream: %w", err))
		}
		s.streams[i].Store(newCstream(s, qs, i))
	}
	for i := range s.streams {
		c.wg.Add(1)
		go s.streams[i].Load().readLoop()
	}
	return s, nil
}

// In TLS 1.3 the client's handshake is complete before the server has
// checked the client's certificate: a server that requires one and gets
// none (or a bad one) closes the connection a round trip after Dial has
// returned. Waiting for that round trip turns it into a dial error instead
// of a lost connection on the first call.
//
// quic-go servers (the reference's included) send NEW_TOKEN next to
// HANDSHAKE_DONE, which the client sees through its TokenStore; for a
// server that sends none, a few round trips of silence count as accepted.

func awaitConfirmation(ctx context.Context, conn *quic.Conn, confirmed <-chan struct{}) error {
	wait := min(max(4*conn.ConnectionStats().SmoothedRTT, 25*time.Millisecond), time.Second)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-confirmed:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	case <-conn.Context().Done():
	}
	// The close may race the confirmation; report it if it is there.
	select {
	case <-conn.Context().Done():
		return context.Cause(conn.Context())
	default:
		return nil
	}
}

// confirmSignal is a quic.TokenStore that stores nothing and signals the
// first NEW_TOKEN frame: the server has confirmed the handshake.
type confirmSignal struct {
	once sync.Once
	ch   chan struct{}
}

func newConfirmSignal() *confirmSignal { return &confirmSignal{ch: make(chan struct{})} }

func (cs *confirmSignal) Pop(string) *quic.ClientToken { return nil }

func (cs *confirmSignal) Put(string, *quic.ClientToken) { cs.once.Do(func() { close(cs.ch) }) }

// Start sends a request without waiting for the answer (it never blocks on
// the network: when flow control says wait, the frame is queued for a
// writer goroutine). On success done will be called exactly once, unless
// the returned Pending is cancelled first. On error done is never called.
func (c *Client) Start(call *Call, done Done) (Pending, error) {
	s, err := c.qconn()
	if err != nil {
		return Pending{}, err
	}
	return s.start(call, done)
}

// Event sends a one-way event; it does not wait for anything.
func (c *Client) Event(method []byte, headers [][]byte, body []byte) error {
	s, err := c.qconn()
	if err != nil {
		return err
	}
	req := Request{Method: method, Headers: headers, Body: body}
	return s.send(frame.KindEvent, &req)
}

// Unary sends a request and waits for its response, the context's deadline
// or its cancellation. A response with a non-zero Code is not an error.
func (c *Client) Unary(ctx context.Context, method string, body []byte, headers ...[]byte) (*Response, error) {
	return unaryVia(ctx, &Call{Method: []byte(method), Headers: headers, Body: body}, c.Start)
}

// Close fails pending calls with ErrClosed, closes the connections and stops
// every goroutine of the client. It is idempotent.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if c.cfg.CloseLinger > 0 {
		c.linger(c.cfg.CloseLinger)
	}
	c.cancel()
	c.wg.Wait()
	return nil
}

// linger closes the send side of every stream (after what is queued) and
// waits, at most d, until the server closes its side of each: that is its
// way of saying it has read everything, so events sent just before Close
// are not lost. Calls still in flight may complete meanwhile.
func (c *Client) linger(d time.Duration) {
	var waits []chan struct{}
	for _, sl := range c.slots {
		s := sl.cur.Load()
		if s == nil || s.dead.Load() {
			continue
		}
		for i := range s.streams {
			st := s.streams[i].Load()
			if st == nil || st.retired.Load() {
				continue
			}
			st.finish()
			waits = append(waits, st.eof)
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for _, w := range waits {
		select {
		case <-w:
		case <-t.C:
			return
		}
	}
}
func (c *Client) qconn() (*qconn, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	n := uint32(len(c.slots))
	start := c.rr.Add(1)
	var sl *slot
	var refused, lost error
	for i := uint32(0); i < n; i++ {
		sl = c.slots[(start+i)%n]
		s := sl.cur.Load()
		if s != nil && !s.dead.Load() {
			return s, nil
		}
		// A dead qconn still in place says why it died before its slot
		// records it (fail writes err before it sets dead): without it a
		// call in that window read "unavailable: reconnecting", no cause.
		if s != nil && lost == nil {
			lost = s.err
		}
		if refused != nil {
			continue
		}
		// A refusal says why, in every window of the re-dial: the dead
		// qconn still in place, or its error recorded.
		if s != nil && s.refusal != nil {
			refused = s.refusal
		} else if e := sl.refusal.Load(); e != nil {
			refused = *e
		}
	}
	if refused != nil {
		return nil, refused
	}
	if lost != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, lost)
	}
	if e := sl.lastErr.Load(); e != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, *e)
	}
	return nil, fmt.Errorf("%w: reconnecting", ErrUnavailable)
}

// slot owns one connection position: the live qconn, and the goroutine
// that dials it (when started empty, as a pool's servers are) and re-dials
// with backoff when it dies.
type slot struct {
	c       *Client
	cur     atomic.Pointer[qconn]
	lastErr atomic.Pointer[error]
	// refusal: the last connection was refused (qconn.refusal), until a
	// new one is up.
	refusal atomic.Pointer[error]
}

func (sl *slot) run(s *qconn) {
	c := sl.c
	defer c.wg.Done()
	// attempt counts consecutive failed dials, and connections that died
	// before they had been up for BackoffBase. gRPC resets the backoff after
	// any successful connection; here one that dies at once (a server that
	// accepts and then closes) counts as a failure, or the client would
	// re-dial it in a tight loop.
	attempt := 0
	everUp := s != nil
	for {
		if s != nil {
			up := time.Now()
			select {
			case <-s.done:
			case <-s.conn.Context().Done():
				// Connection-level end seen before any stream noticed it.
				s.fail(context.Cause(s.conn.Context()))
			case <-c.ctx.Done():
				s.fail(ErrClosed)
				s.release()
				return
			}
			s.release()
			sl.lastErr.Store(&s.err)
			if s.refusal != nil {
				sl.refusal.Store(&s.refusal)
			}
			sl.cur.Store(nil)
			c.stateChanged()
			if time.Since(up) >= c.cfg.BackoffBase {
				attempt = 0
			}
			c.cfg.Logger.Warn("qrpc connection lost, re-dialling", "addr", c.addr, "err", s.err)
		}
		for ; ; attempt++ {
			if attempt > 0 {
				t := time.NewTimer(backoff(c.cfg.BackoffBase, c.cfg.BackoffMax, attempt-1))
				select {
				case <-t.C:
				case <-c.ctx.Done():
					t.Stop()
					return
				}
			}
			ns, err := c.dial(c.ctx)
			if err == nil {
				s = ns
				sl.refusal.Store(nil)
				sl.cur.Store(ns)
				if everUp {
					c.reconnects.Add(1)
					c.obs.Reconnected()
					c.cfg.Logger.Info("qrpc connection re-established", "addr", c.addr, "attempt", attempt+1)
				}
				everUp = true
				c.stateChanged()
				attempt++
				break
			}
			if c.ctx.Err() != nil {
				return
			}
			sl.lastErr.Store(&err)
			c.cfg.Logger.Warn("qrpc re-dial failed", "addr", c.addr, "attempt", attempt+1, "err", err)
		}
	}
}

// backoff is the gRPC connection-backoff delay before retry n (0-based):
// base × 1.6^n, capped, ±20 % jitter.
func backoff(base, maxDelay time.Duration, n int) time.Duration {
	return backoffJittered(base, maxDelay, n, 2*rand.Float64()-1)
}

// backoffJittered is backoff with its jitter given, in [-1, 1]: -1 takes
// 20 % off, 1 adds 20 %.
func backoffJittered(base, maxDelay time.Duration, n int, jitter float64) time.Duration {
	d := float64(base)
	for i := 0; i < n && d < float64(maxDelay); i++ {
		d *= 1.6
	}
	if d > float64(maxDelay) {
		d = float64(maxDelay)
	}
	d *= 1 + 0.2*jitter
	return time.Duration(d)
}

// qconn is one live QUIC connection of a Client, with its streams and
// in-flight calls.
type qconn struct {
	c *Client
	// conn is the QUIC connection; streams are its request streams, each
	// replaced in place when it breaks or gets stuck (the connection
	// outlives a stream).
	conn        *quic.Conn
	tr          *quic.Transport // the connection's own, on sock; closed by release
	sock        *udpSocket
	streams     []atomic.Pointer[cstream]
	rr          atomic.Uint32 // counts small frames: StreamBatch per stream
	rrBig       atomic.Uint32 // counts big frames: one per stream
	nextID      atomic.Uint64
	maxAnswered atomic.Uint64 // highest request id answered, any stream
	suspects    atomic.Int32  // streams with a stuckSince set
	pending     pendingMap
	deadlines   deadlines // times out the pending calls that have a deadline

	dead     atomic.Bool
	failOnce sync.Once
	done     chan struct{}
	err      error // set before done is closed
	// refusal is the DialError of a connection the server refused after
	// the client's handshake (TLS 1.3 client certificate); set before dead.
	refusal error
	// confirmed is closed when the server confirms the handshake (its
	// NEW_TOKEN, next to HANDSHAKE_DONE).
	confirmed <-chan struct{}
	// upAt is when Dial had the connection (the client's clock).
	upAt time.Time
}

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
				return Pending{}, s.refusal
			}
			return Pending{}, fmt.Errorf("%w: %v", ErrUnavailable, s.err)
		}
		// Timed only once the call is in the map: a deadline that passed
		// before would find nothing to take, and the call would never time
		// out. A response that comes first has removed it for good, and
		// add then does nothing.
		if !call.Deadline.IsZero() {
			pc.wait = time.Until(call.Deadline)
			s.deadlines.add(pc)
		}
		err := st.write(buf)
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
		if err := st.write(buf); !errors.Is(err, errStreamGone) {
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

// expire times out a call whose deadline passed (the deadlines' timer).
func (s *qconn) expire(pc *pendingCall) {
	if s.take(pc.id) == nil {
		return // answered, cancelled or failed meanwhile
	}
	pc.done(nil, fmt.Errorf("%w: no response within %v", ErrTimeout, pc.wait))
	pc.st.checkStuck(pc.id)
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
	p.s.deadlines.remove(pc)
	// A caller giving up at the deadline (Unary's context fires with the
	// timer) is a timeout: the stream may be stuck.
	if !pc.deadline.IsZero() && !p.s.c.now().Before(pc.deadline) {
		pc.st.checkStuck(p.id)
	}
	return true
}

// fail marks the qconn dead, fails every pending call with err and
// closes the connection. Only the first call has an effect.
func (s *qconn) fail(err error) {
	s.failOnce.Do(func() {
		s.err = err
		callErr := err
		switch {
		case errors.Is(err, ErrClosed):
		case refusedBy(err):
			callErr = classifyDialError(s.c.addr, err)
			s.refusal = callErr
		case s.droppedUnconfirmed(err):
			callErr = &DialError{Addr: s.c.addr, Reason: ReasonTLSFailed, Err: err}
			s.refusal = callErr
		default:
			callErr = fmt.Errorf("%w: %w", ErrConnLost, err)
		}
		s.dead.Store(true) // after refusal: readers of dead see it
		s.deadlines.close()
		s.pending.closeAll(func(pc *pendingCall) {
			pc.done(nil, callErr)
		})
		if errors.Is(err, ErrProtocol) {
			_ = s.conn.CloseWithError(1, "protocol error")
		} else {
			_ = s.conn.CloseWithError(0, "")
		}
		close(s.done)
	})
}

// release closes the qconn's transport and socket, once fail has closed
// the connection (and sent its CONNECTION_CLOSE through them).
func (s *qconn) release() {
	if s.tr != nil {
		closeTransport(s.tr, s.sock)
	}
}

func closeTransport(tr *quic.Transport, sock *udpSocket) {
	_ = tr.Close()
	_ = sock.Close()
}

// refusedBy reports whether the connection's end err is a TLS alert from
// the server. It can arrive after the client has finished its side of the
// handshake (TLS 1.3: the server judges the client certificate last): the
// connection was refused, not lost, whichever the client saw first.
func refusedBy(err error) bool {
	var tErr *quic.TransportError
	return errors.As(err, &tErr) && tErr.Remote && tErr.ErrorCode.IsCryptoError()
}

// droppedUnconfirmed reports a connection that the server forgot before
// it confirmed the handshake or answered anything, within the dial's own
// time (DialTimeout) after Dial returned: a stateless reset then means the
// server ended the handshake (it refused the connection, and its alert was
// lost or overtaken by the client's next packet), so the connection was
// never up and the failure is the dial's, not a loss. A connection older
// than that was taken as accepted (awaitConfirmation counts silence as
// consent from a server that confirms nothing, and events get no answer):
// its reset is a loss, a restarted server.
func (s *qconn) droppedUnconfirmed(err error) bool {
	var reset *quic.StatelessResetError
	if !errors.As(err, &reset) || s.maxAnswered.Load() != 0 {
		return false
	}
	if s.c.now().Sub(s.upAt) > s.c.cfg.DialTimeout {
		return false
	}
	select {
	case <-s.confirmed:
		return false
	default:
		return true
	}
}

// connLevel reports whether err from a stream is really the connection's
// end (closed, idle timeout, stateless reset, transport error) rather than
// the stream's own (reset, stop-sending, end of stream).
func (s *qconn) connLevel(err error) bool {
	if s.conn.Context().Err() != nil {
		return true
	}
	var se *quic.StreamError
	return !errors.As(err, &se) && !errors.Is(err, io.EOF)
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

	mu       sync.Mutex
	queue    []*[]byte // frames waiting for flow-control credit, in order
	queued   int       // bytes in queue
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

// write sends one encoded frame. The fast path queues it in quic-go without
// blocking; otherwise a flusher goroutine writes it when flow control
// allows, preserving order. It takes ownership of buf unless it returns
// errStreamGone (the stream was out of service: buf is the caller's to
// send elsewhere).
func (st *cstream) write(buf *[]byte) error {
	s := st.sess
	codec := s.c.codec
	st.mu.Lock()
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
			go func() {
				defer s.c.wg.Done()
				s.fail(fmt.Errorf("write: %w", err))
			}()
			if refusedBy(err) {
				return classifyDialError(s.c.addr, err)
			}
			return fmt.Errorf("%w: write: %v", ErrConnLost, err)
		}
	}
	if st.queued+len(*buf) > maxQueued {
		st.mu.Unlock()
		codec.PutBuffer(buf)
		return ErrQueueFull
	}
	st.queue = append(st.queue, buf)
	st.queued += len(*buf)
	if !st.flushing {
		st.flushing = true
		s.c.wg.Add(1)
		go st.flush()
	}
	st.mu.Unlock()
	return nil
}

func (st *cstream) flush() {
	s := st.sess
	defer s.c.wg.Done()
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
		buf := st.queue[0]
		st.queue[0] = nil
		st.queue = st.queue[1:]
		st.queued -= len(*buf)
		st.mu.Unlock()
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
			for _, b := range st.queue {
				codec.PutBuffer(b)
			}
			st.queue, st.queued, st.flushing = nil, 0, false
			st.mu.Unlock()
			return
		}
	}
}

// broken takes a stream the server reset (or ended) out of service: its
// calls fail (they may have run), the stream is cancelled both ways and a
// new one takes its place. The connection and its other streams go on.
func (st *cstream) broken(cause error) {
	s := st.sess
	if since := st.stuckSince.Swap(0); since != 0 {
		s.suspects.Add(-1)
	}
	if !st.retired.CompareAndSwap(false, true) {
		return
	}
	s.c.cfg.Logger.Debug("qrpc stream broken, reopening", "addr", s.c.addr, "err", cause)
	err := fmt.Errorf("%w: stream: %v", ErrConnLost, cause)
	// The calls fail on a goroutine of their own: broken may run inside
	// Start (a write that found the stream reset), whose caller may hold a
	// lock that done takes.
	s.c.wg.Add(1)
	go func() {
		defer s.c.wg.Done()
		s.pending.takeWhere(func(pc *pendingCall) bool { return pc.st == st }, func(pc *pendingCall) {
			s.deadlines.remove(pc)
			st.inflight.Add(-1)
			pc.done(nil, err)
		})
	}()
	st.cancel()
	s.replace(st)
}

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
	go func() {
		defer c.wg.Done()
		for attempt := 0; ; attempt++ {
			if attempt > 0 {
				t := time.NewTimer(backoff(c.cfg.BackoffBase, c.cfg.BackoffMax, attempt-1))
				select {
				case <-t.C:
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
				go ns.readLoop()
				s.streams[old.idx].Store(ns)
				if attempt > 0 {
					c.cfg.Logger.Info("qrpc stream reopened", "addr", c.addr, "attempt", attempt+1)
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
			if attempt == 0 {
				c.cfg.Logger.Warn("qrpc cannot reopen a stream, retrying", "addr", c.addr, "err", err)
			}
		}
	}()
}

func (st *cstream) readLoop() {
	s := st.sess
	defer s.c.wg.Done()
	defer func() {
		if r := recover(); r != nil {
			s.fail(fmt.Errorf("%w: panic in reader: %v", ErrProtocol, r))
		}
	}()
	fr := s.c.codec.NewReader(st.s)
	var resp Response
	for {
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
		if kind != frame.KindResponse {
			s.fail(fmt.Errorf("%w: server sent a frame of kind %d", ErrProtocol, kind))
			return
		}
		s.c.obs.BytesReceived(len(payload) + frame.HeaderSize)
		// Reset every field (unknown ones too, or they would pile up) but
		// keep the headers' backing array.
		resp = Response{Headers: resp.Headers[:0]}
		// Unsafe: fields alias payload, which stays valid until Next is called
		// again, i.e. for the whole of done().
		if err := resp.UnmarshalVTUnsafe(payload); err != nil {
			s.fail(fmt.Errorf("%w: bad response: %v", ErrProtocol, err))
			return
		}
		st.answered(resp.RequestId)
		pc := s.take(resp.RequestId)
		if pc == nil {
			continue // cancelled or timed out: drop quietly
		}
		s.deadlines.remove(pc)
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

func atomicMax(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

type pendingCall struct {
	id       uint64
	done     Done
	st       *cstream      // the stream the request went on
	deadline time.Time     // zero: none
	wait     time.Duration // the deadline, from the start, for the error
	hidx     int           // index in its deadlines heap, or hidxNew, hidxDone; under that shard's lock
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
