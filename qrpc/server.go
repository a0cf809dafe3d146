package qrpc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/srvinfo"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
)

// Handler answers a request by filling resp (RequestId is set for it).
// req and its slices belong to the handler until it returns.
type Handler func(ctx context.Context, req *Request, resp *Response)

// EventHandler receives a one-way event.
type EventHandler func(ctx context.Context, req *Request)

// ServerConfig configures a Server. The zero value works.
type ServerConfig struct {
	// MaxFrameSize bounds frames both ways (default 16 MiB).
	MaxFrameSize int
	// IdleTimeout closes connections that hear nothing for this long
	// (default 30 s; clients keep alive below it).
	IdleTimeout time.Duration
	// MaxStreams per connection the peer may open (default 1024).
	MaxStreams int
	// MaxHandlers bounds the handlers running at once per connection
	// (default 4096); past it the connection's readers wait.
	MaxHandlers int
	// StatelessResetKey lets a restarted server tell clients of the previous
	// process that their connection is gone, so they re-dial at once instead
	// of waiting for their idle timeout. Keep it secret and stable across
	// restarts. Default: derived from the private key of the first
	// certificate in the TLS config, so a server
	// restarted with the same certificate gets this for free.
	StatelessResetKey *quic.StatelessResetKey
	// Logger receives the server's log lines. Default: slog.Default().
	Logger *slog.Logger
}

// Server serves qrpc over QUIC.
type Server struct {
	cfg      ServerConfig
	codec    *frame.Codec
	handlers atomic.Pointer[handlerSet]
	regMu    sync.Mutex

	mu     sync.Mutex
	ln     *quic.Listener
	tr     *quic.Transport
	pc     net.PacketConn // closed by Shutdown when Listen opened it
	conns  map[*quic.Conn]struct{}
	closed bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine of the server

	// Handlers in flight, for a graceful Shutdown. Not a WaitGroup: handlers
	// start while Shutdown waits, which WaitGroup forbids.
	running  atomic.Int64
	draining atomic.Bool
	idle     chan struct{} // a token when running drops to 0 while draining
}

type handlerSet struct {
	unary  map[string]Handler
	events map[string]EventHandler
}

// NewServer returns a server with no handlers.
func NewServer(cfg *ServerConfig) *Server {
	var c ServerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 30 * time.Second
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = 1024
	}
	if c.MaxHandlers == 0 {
		c.MaxHandlers = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	s := &Server{cfg: c, codec: frame.New(c.MaxFrameSize), conns: map[*quic.Conn]struct{}{}, idle: make(chan struct{}, 1)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.handlers.Store(&handlerSet{unary: map[string]Handler{}, events: map[string]EventHandler{}})
	return s
}

// Handle registers the handler of a unary method. Safe at any time.
func (s *Server) Handle(method string, h Handler) {
	s.update(func(hs *handlerSet) { hs.unary[method] = h })
}

// HandleEvent registers the handler of an event method. Safe at any time.
func (s *Server) HandleEvent(method string, h EventHandler) {
	s.update(func(hs *handlerSet) { hs.events[method] = h })
}

// update copies the handler set so that readers never take a lock.
func (s *Server) update(f func(*handlerSet)) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	old := s.handlers.Load()
	hs := &handlerSet{unary: make(map[string]Handler, len(old.unary)+1), events: make(map[string]EventHandler, len(old.events)+1)}
	for k, v := range old.unary {
		hs.unary[k] = v
	}
	for k, v := range old.events {
		hs.events[k] = v
	}
	f(hs)
	s.handlers.Store(hs)
}

// ServerTLSConfig returns a TLS 1.3 config offering ALPN qrpc with cert.
// With clientCAs non-nil, clients must present a certificate it signs.
func ServerTLSConfig(cert tls.Certificate, clientCAs *x509.CertPool) *tls.Config {
	t := &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{ALPN},
		MinVersion:   tls.VersionTLS13,
	}
	if clientCAs != nil {
		t.ClientCAs = clientCAs
		t.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return t
}

// resetKeyFromCertificate derives a stateless-reset key from the private key
// of cert, so a server restarted with the same certificate can reset the
// connections of its previous process.
func resetKeyFromCertificate(cert tls.Certificate) (*quic.StatelessResetKey, error) {
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("reset key: %w", err)
	}
	h := sha256.New()
	h.Write([]byte("qrpc stateless reset key\x00"))
	h.Write(der)
	var k quic.StatelessResetKey
	copy(k[:], h.Sum(nil))
	return &k, nil
}

// Listen binds addr (UDP) and serves in the background; it returns the
// bound address (useful with port 0). The server closes the socket on
// Shutdown/Close, so the port can be bound again at once (a restart).
func (s *Server) Listen(addr string, tlsConf *tls.Config) (net.Addr, error) {
	udpAddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	uc, err := net.ListenUDP("udp", udpAddr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	// The client's socket wrapper: on Linux its reads and sends are raw
	// system calls, which do not wake Go's sysmon (see rawIO).
	pc := newUDPSocket(uc)
	if err := s.start(pc, tlsConf, true); err != nil {
		_ = pc.Close()
		return nil, err
	}
	return pc.LocalAddr(), nil
}

// ServePacketConn serves on a socket the caller owns (socket activation, a
// shared port, or a test that wants to pull the plug), in the background.
// Shutdown/Close stop serving but leave pc open.
func (s *Server) ServePacketConn(pc net.PacketConn, tlsConf *tls.Config) error {
	return s.start(pc, tlsConf, false)
}

// ListenAndServe serves on addr until Close.
func (s *Server) ListenAndServe(addr string, tlsConf *tls.Config) error {
	if _, err := s.Listen(addr, tlsConf); err != nil {
		return err
	}
	<-s.ctx.Done()
	return nil
}

func (s *Server) start(pc net.PacketConn, tlsConf *tls.Config, ownSocket bool) error {
	if tlsConf == nil {
		return fmt.Errorf("%w: server needs a TLS config", ErrBadConfig)
	}
	if len(tlsConf.NextProtos) == 0 {
		tlsConf = tlsConf.Clone()
		tlsConf.NextProtos = []string{ALPN}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.ln != nil {
		return fmt.Errorf("%w: server is already listening", ErrBadConfig)
	}
	key := s.cfg.StatelessResetKey
	if key == nil && len(tlsConf.Certificates) > 0 {
		k, err := resetKeyFromCertificate(tlsConf.Certificates[0])
		if err != nil {
			// A key that cannot be exported (an HSM signer): serve without.
			s.cfg.Logger.Warn("qrpc: no stateless reset key; restarts will look like timeouts to clients", "err", err)
		}
		key = k
	}
	tr := &quic.Transport{Conn: pc, StatelessResetKey: key}
	ln, err := tr.Listen(tlsConf, &quic.Config{
		MaxIdleTimeout:             s.cfg.IdleTimeout,
		MaxIncomingStreams:         int64(s.cfg.MaxStreams),
		MaxIncomingUniStreams:      -1,
		InitialStreamReceiveWindow: 512 << 10,
		MaxStreamReceiveWindow:     4 << 20,
		MaxConnectionReceiveWindow: 16 << 20,
	})
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.ln, s.tr = ln, tr
	if ownSocket {
		s.pc = pc
	}
	s.wg.Add(1)
	safego.Go("server accept", func() { s.acceptLoop(ln) }, nil)
	return nil
}

func (s *Server) acceptLoop(ln *quic.Listener) {
	defer s.wg.Done()
	for {
		conn, err := ln.Accept(s.ctx)
		if err != nil {
			if s.ctx.Err() == nil && !errors.Is(err, quic.ErrServerClosed) {
				s.cfg.Logger.Error("qrpc accept", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = conn.CloseWithError(0, "server closing")
			return
		}
		s.conns[conn] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		safego.Go("server connection", func() { s.serveConn(conn) }, nil)
	}
}

func (s *Server) serveConn(conn *quic.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
	}()
	sem := make(chan struct{}, s.cfg.MaxHandlers)
	for {
		st, err := conn.AcceptStream(s.ctx)
		if err != nil {
			return
		}
		s.wg.Add(1)
		safego.Go("server stream", func() { s.serveStream(conn, st, sem) }, nil)
	}
}

type sstream struct {
	s       *quic.Stream
	ctx     context.Context // the connection's, with the stream's id
	mu      sync.Mutex      // one writer at a time
	running sync.WaitGroup  // handlers of this stream still to answer
}

func (s *Server) serveStream(conn *quic.Conn, qs *quic.Stream, sem chan struct{}) {
	defer s.wg.Done()
	// once per stream, not per request: streams are long-lived
	cctx := conn.Context()
	st := &sstream{s: qs, ctx: srvinfo.With(cctx, int64(qs.StreamID()), cctx)}
	fr := s.codec.NewReader(qs)
	for {
		kind, payload, err := fr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				// The client closed its side (Client.Close): answer what is
				// in flight, then close ours, which tells the client that
				// everything it sent has been read.
				st.running.Wait()
				_ = qs.Close()
				return
			}
			if !isEndOfStream(err) {
				s.cfg.Logger.Warn("qrpc stream closed on bad input", "remote", conn.RemoteAddr().String(), "err", err)
				qs.CancelRead(1)
				qs.CancelWrite(1)
			}
			return
		}
		if kind == frame.KindResponse {
			s.cfg.Logger.Warn("qrpc client sent a response frame; ignored", "remote", conn.RemoteAddr().String())
			continue
		}
		// One copy of the payload that the fields alias, instead of one
		// allocation per field: the handler outlives the reader's buffer.
		req := new(Request)
		if err := req.UnmarshalVTUnsafe(bytes.Clone(payload)); err != nil {
			// Garbage that still had valid framing: the stream stays usable.
			s.cfg.Logger.Warn("qrpc bad request payload", "remote", conn.RemoteAddr().String(), "err", err)
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		s.running.Add(1)
		if kind == frame.KindEvent {
			safego.Go("server handler", func() { s.runEvent(conn, req, sem) }, nil)
		} else {
			st.running.Add(1)
			safego.Go("server handler", func() {
				defer st.running.Done()
				s.runUnary(conn, st, req, sem)
			}, nil)
		}
	}
}

func isEndOfStream(err error) bool {
	var se *quic.StreamError
	var ae *quic.ApplicationError
	var ie *quic.IdleTimeoutError
	return errors.Is(err, net.ErrClosed) || errors.As(err, &se) || errors.As(err, &ae) ||
		errors.As(err, &ie) || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) ||
		errors.Is(err, quic.ErrServerClosed) || isStatelessReset(err)
}

func isStatelessReset(err error) bool {
	var sr *quic.StatelessResetError
	return errors.As(err, &sr)
}

func (s *Server) handlerDone(sem chan struct{}) {
	<-sem
	if s.running.Add(-1) == 0 && s.draining.Load() {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

func (s *Server) runEvent(conn *quic.Conn, req *Request, sem chan struct{}) {
	defer s.handlerDone(sem)
	h := s.handlers.Load().events[string(req.Method)]
	if h == nil {
		s.cfg.Logger.Debug("qrpc event for unknown method dropped", "method", string(req.Method))
		return
	}
	defer func() {
		if r := recover(); r != nil {
			s.cfg.Logger.Error("qrpc event handler panicked", "method", string(req.Method), "panic", r, "stack", string(debug.Stack()))
		}
	}()
	h(conn.Context(), req)
}

func (s *Server) runUnary(conn *quic.Conn, st *sstream, req *Request, sem chan struct{}) {
	defer s.handlerDone(sem)
	resp := &Response{}
	h := s.handlers.Load().unary[string(req.Method)]
	if h == nil {
		resp.Code = CodeUnknownMethod
		resp.Body = []byte(fmt.Sprintf("qrpc: unknown method %q", req.Method))
	} else {
		func() {
			defer func() {
				if r := recover(); r != nil {
					s.cfg.Logger.Error("qrpc handler panicked", "method", string(req.Method), "panic", r, "stack", string(debug.Stack()))
					*resp = Response{Code: CodeInternal, Body: []byte("qrpc: internal error in handler")}
				}
			}()
			h(st.ctx, req, resp)
		}()
	}
	resp.RequestId = req.RequestId
	buf := s.codec.GetBuffer()
	defer s.codec.PutBuffer(buf)
	b, err := s.codec.AppendResponse((*buf)[:0], resp)
	if err != nil {
		s.cfg.Logger.Error("qrpc encode response", "method", string(req.Method), "err", err)
		b, _ = s.codec.AppendResponse((*buf)[:0], &Response{
			RequestId: req.RequestId, Code: CodeInternal, Body: []byte("qrpc: response too large"),
		})
	}
	*buf = b
	st.mu.Lock()
	_, err = st.s.Write(b)
	st.mu.Unlock()
	if err != nil && !isEndOfStream(err) {
		s.cfg.Logger.Debug("qrpc write response", "err", err)
	}
}

// Shutdown stops accepting connections, waits for running handlers (or
// ctx), then closes every connection.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	ln, tr, pc := s.ln, s.tr, s.pc
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	s.draining.Store(true)
	var err error
	for s.running.Load() > 0 && err == nil {
		select {
		case <-s.idle:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err == nil {
		s.linger(ctx)
	}
	s.mu.Lock()
	for c := range s.conns {
		_ = c.CloseWithError(0, "server closing")
	}
	s.mu.Unlock()
	s.cancel()
	if tr != nil {
		_ = tr.Close()
	}
	if pc != nil {
		_ = pc.Close()
	}
	s.wg.Wait()
	return err
}

// linger gives the last responses time to reach the clients: a QUIC peer
// that receives CONNECTION_CLOSE drops stream data it has not read yet, and
// quic-go cannot tell when what we wrote has been acknowledged. A few round
// trips (at least 50 ms, at most 1 s) is the best effort.
func (s *Server) linger(ctx context.Context) {
	var rtt time.Duration
	s.mu.Lock()
	n := len(s.conns)
	for c := range s.conns {
		rtt = max(rtt, c.ConnectionStats().SmoothedRTT)
	}
	s.mu.Unlock()
	if n == 0 {
		return
	}
	t := time.NewTimer(min(max(4*rtt, 50*time.Millisecond), time.Second))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Close shuts down, giving running handlers up to 5 seconds.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Shutdown(ctx)
}
