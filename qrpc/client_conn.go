package qrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

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
	sock.conn.Store(conn)
	if c.cfg.skipConfirmation {
		// Tests: let the server's verdict arrive after Dial, as it can
		// when the confirmation wait runs out under load.
	} else if err := awaitConfirmation(ctx, conn, confirmed.ch); err != nil {
		return fail(conn, err)
	}
	s := &qconn{c: c, conn: conn, tr: tr, sock: sock, done: make(chan struct{}), confirmed: confirmed.ch, upAt: c.now()}
	s.pending.init()
	s.deadlines.init(s.expire, s.abort)
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
		safego.Go("stream reader", s.streams[i].Load().readLoop, nil)
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

// Pop and Put run on quic-go's goroutines, where a panic would end the
// process: one is reported and counted, and Put still signals.

func (cs *confirmSignal) Pop(string) *quic.ClientToken {
	defer safego.Recover("quic callback", nil)
	safego.Inject("quic callback")
	return nil
}

func (cs *confirmSignal) Put(string, *quic.ClientToken) {
	signal := func() { cs.once.Do(func() { close(cs.ch) }) }
	defer safego.Recover("quic callback", signal)
	safego.Inject("quic callback")
	signal()
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

	// The probes of a connection with calls in flight (probe.go):
	// probing is set while the prober serves it; probeAt is its last
	// probe interval's start, probeSeen the socket's send count then
	// (the prober's ticks' alone).
	probing   atomic.Bool
	probeAt   time.Time
	probeSeen uint64
}

// fail marks the qconn dead, fails every pending call with err and
// closes the connection. Only the first call has an effect. A panic on
// the way (a bug here, or in a call's done) is contained where it
// happens: the steps after it still run, and each call still ends
// exactly once (endCall), so none waits for nothing and the connection
// does not stay open unserved.
func (s *qconn) fail(err error) {
	s.failOnce.Do(func() {
		s.err = err
		callErr := error(fmt.Errorf("%w: connection fail", ErrInternal))
		safego.Run("connection fail", func() { callErr = s.failErr(err) }, nil)
		s.dead.Store(true) // after refusal: readers of dead see it
		safego.Run("connection fail", s.deadlines.close, nil)
		s.pending.closeAll(func(pc *pendingCall) {
			endCall("connection fail", pc, callErr, nil)
		})
		safego.Run("connection fail", func() {
			if errors.Is(err, ErrProtocol) {
				_ = s.conn.CloseWithError(1, "protocol error")
			} else {
				_ = s.conn.CloseWithError(0, "")
			}
		}, nil)
		close(s.done)
	})
}

// failErr is the error the calls of a connection that ended with err
// fail with; it sets refusal for a connection the server refused.
func (s *qconn) failErr(err error) error {
	switch {
	case errors.Is(err, ErrClosed), errors.Is(err, ErrInternal):
		return err
	case refusedBy(err):
		s.refusal = classifyDialError(s.c.addr, err)
		return s.refusal
	case s.droppedUnconfirmed(err):
		s.refusal = &DialError{Addr: s.c.addr, Reason: ReasonTLSFailed, Err: err}
		return s.refusal
	default:
		return fmt.Errorf("%w: %w", ErrConnLost, err)
	}
}

// endCall ends pc with err on behalf of where (a kind of goroutine):
// before runs first (nil: nothing), then pc's done. A panic before done
// has the call (a bug on the way) ends it with ErrInternal instead; one
// in done (the caller's) goes no further. Either way the call ends
// exactly once and the caller's loop over its calls goes on.
func endCall(where string, pc *pendingCall, err error, before func()) {
	handed := false
	safego.Run(where, func() {
		safego.Inject(where)
		if before != nil {
			before()
		}
		handed = true
		pc.done(nil, err)
	}, func() {
		if !handed {
			handed = true
			pc.done(nil, fmt.Errorf("%w: %s", ErrInternal, where))
		}
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
