package qrpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
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
	// clk times the re-dials (when a connection came up, the backoff's
	// wait) and jitter, when set, replaces the backoff's random jitter
	// (in [-1, 1]): realClock{} and nil in production; a test's own
	// (clock_test.go) make the schedule exact.
	clk    clock
	jitter func() float64

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
		safego.Go("redial", func() { slots[i].run(s) }, nil)
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
		clk:      realClock{},
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
		safego.Go("redial", func() { sl.run(nil) }, nil)
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
		// Nothing was sent: a pool tries another server (neverSent).
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, refused)
	}
	if lost != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, lost)
	}
	if e := sl.lastErr.Load(); e != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, *e)
	}
	return nil, fmt.Errorf("%w: reconnecting", ErrUnavailable)
}
