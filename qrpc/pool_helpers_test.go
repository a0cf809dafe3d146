package qrpc_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// fleet is a set of real qrpc servers sharing one CA and certificate (and
// so one stateless reset key), each on a UDP socket the test owns: kill
// closes the socket under the server, as kill -9 would (the port is closed:
// the kernel answers ICMP port unreachable), freeze silences it with the
// port still open, as SIGSTOP or a partition would, and restart serves the
// same port again.
type fleet struct {
	t    *testing.T
	ca   *certs.CA
	cert tls.Certificate
	key  *quic.StatelessResetKey
	srvs []*member
}

type member struct {
	f     *fleet
	i     int
	addr  string
	mu    sync.Mutex
	pc    *testsrv.MutePacketConn
	srv   *qrpc.Server
	hits  atomic.Int64  // "who" calls answered
	evts  atomic.Int64  // "tick" events
	delay atomic.Int64  // milliseconds "work" takes
	code  atomic.Uint32 // the code "busy" answers with
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	ca, cert, err := certs.NewLocal("pool test ca")
	if err != nil {
		t.Fatal(err)
	}
	key, err := qrpc.ResetKeyFromCertificate(cert)
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, ca: ca, cert: cert, key: key}
}

// add starts a server on addr ("127.0.0.1:0" for any port).
func (f *fleet) add(addr string) *member {
	f.t.Helper()
	m := &member{f: f, i: len(f.srvs)}
	f.srvs = append(f.srvs, m)
	m.serve(addr)
	f.t.Cleanup(m.kill)
	return m
}

func (f *fleet) start(n int) []string {
	var addrs []string
	for range n {
		addrs = append(addrs, f.add("127.0.0.1:0").addr)
	}
	return addrs
}

func (m *member) serve(addr string) {
	t := m.f.t
	t.Helper()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var pc *net.UDPConn
	// A restart may race the kernel releasing the port: retry, bounded.
	testwait.For(5*time.Second, func() bool {
		pc, err = net.ListenUDP("udp", ua)
		return err == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := qrpc.NewServer(&qrpc.ServerConfig{StatelessResetKey: m.f.key, Logger: quiet})
	name := []byte("s" + strconv.Itoa(m.i))
	srv.Handle("who", func(_ context.Context, _ *qrpc.Request, resp *qrpc.Response) {
		m.hits.Add(1)
		resp.Body = name
	})
	srv.Handle("work", func(ctx context.Context, _ *qrpc.Request, resp *qrpc.Response) {
		m.hits.Add(1)
		select {
		case <-time.After(time.Duration(m.delay.Load()) * time.Millisecond):
		case <-ctx.Done():
		}
		resp.Body = name
	})
	srv.Handle("busy", func(_ context.Context, _ *qrpc.Request, resp *qrpc.Response) {
		m.hits.Add(1)
		resp.Code = m.code.Load()
		resp.Body = name
	})
	srv.Handle("hc", func(_ context.Context, _ *qrpc.Request, resp *qrpc.Response) { resp.Body = []byte("ok") })
	srv.HandleEvent("tick", func(context.Context, *qrpc.Request) { m.evts.Add(1) })
	mp := &testsrv.MutePacketConn{PacketConn: pc}
	if err := srv.ServePacketConn(mp, qrpc.ServerTLSConfig(m.f.cert, nil)); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.pc, m.srv = mp, srv
	m.addr = pc.LocalAddr().String()
	m.mu.Unlock()
}

// kill pulls the socket from under the server: no close, no reset, the
// peer just goes silent.
func (m *member) kill() {
	m.mu.Lock()
	pc, srv := m.pc, m.srv
	m.pc, m.srv = nil, nil
	m.mu.Unlock()
	if pc == nil {
		return
	}
	_ = pc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

func (m *member) restart() { m.serve(m.addr) }

// freeze makes the server silent, its port still open: packets to it are
// dropped and it sends nothing, so the client hears nothing at all.
func (m *member) freeze() { m.setMuted(true) }

func (m *member) thaw() { m.setMuted(false) }

func (m *member) setMuted(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pc != nil {
		m.pc.Mute(on)
	}
}

func (f *fleet) config(pc *qrpc.PoolConfig) *qrpc.PoolConfig {
	if pc == nil {
		pc = &qrpc.PoolConfig{}
	}
	if pc.CAPEM == nil {
		pc.CAPEM = f.ca.CertPEM
	}
	if pc.Logger == nil {
		pc.Logger = quiet
	}
	if pc.BackoffBase == 0 {
		pc.BackoffBase, pc.BackoffMax = 50*time.Millisecond, 300*time.Millisecond
	}
	if pc.DialTimeout == 0 {
		pc.DialTimeout = 2 * time.Second
	}
	pc.CloseLinger = -1
	return pc
}

func (f *fleet) dial(t *testing.T, addrs []string, pc *qrpc.PoolConfig) *qrpc.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := qrpc.DialPool(ctx, addrs, f.config(pc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func poolCall(p *qrpc.Pool, timeout time.Duration, method string, key string) (*qrpc.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := &qrpc.Call{Method: []byte(method)}
	if key != "" {
		c.HashKey = []byte(key)
	}
	return p.Do(ctx, c)
}

func peerState(p *qrpc.Pool, addr string) (qrpc.PeerInfo, bool) {
	for _, in := range p.Peers() {
		if in.Addr == addr {
			return in, true
		}
	}
	return qrpc.PeerInfo{}, false
}

// recorder is an Observer that keeps what tests check.
type recorder struct {
	mu        sync.Mutex
	peers     map[string]*peerRec
	throttled atomic.Int64
}

func (r *recorder) Throttled([]byte) { r.throttled.Add(1) }

type peerRec struct {
	addr                     string
	r                        *recorder
	ok, failed, events       atomic.Int64
	refused                  atomic.Int64 // attempts refused at once (unavailable), apart from failed
	inflight, ejected, recon atomic.Int64
	sent, recv               atomic.Int64
	retried, hedged, budget  atomic.Int64
	mu                       sync.Mutex
	states                   []qrpc.PeerState
	failedAt                 []time.Time
}

func newRecorder() *recorder { return &recorder{peers: map[string]*peerRec{}} }

func (r *recorder) Peer(addr string) observe.PeerObserver {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pr := r.peers[addr]; pr != nil {
		return pr
	}
	pr := &peerRec{addr: addr, r: r}
	r.peers[addr] = pr
	return pr
}

func (r *recorder) get(addr string) *peerRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peers[addr]
}

func (p *peerRec) CallDone(_ []byte, _ uint32, err error, _ time.Duration) {
	if err == nil {
		p.ok.Add(1)
		return
	}
	if errors.Is(err, qrpc.ErrUnavailable) {
		// refused by the connection before anything was sent: the pool
		// sends the call elsewhere, so no caller sees this failure
		p.refused.Add(1)
		return
	}
	p.failed.Add(1)
	p.mu.Lock()
	p.failedAt = append(p.failedAt, time.Now())
	p.mu.Unlock()
}
func (p *peerRec) EventDone(_ []byte, err error) {
	if err == nil {
		p.events.Add(1)
	}
}
func (p *peerRec) InflightAdd(d int) { p.inflight.Add(int64(d)) }
func (p *peerRec) Retried(error)     { p.retried.Add(1) }
func (p *peerRec) Hedged()           { p.hedged.Add(1) }
func (p *peerRec) BudgetExhausted()  { p.budget.Add(1) }
func (p *peerRec) StateChanged(s qrpc.PeerState) {
	p.mu.Lock()
	p.states = append(p.states, s)
	p.mu.Unlock()
}
func (p *peerRec) Reconnected()        { p.recon.Add(1) }
func (p *peerRec) Ejected()            { p.ejected.Add(1) }
func (p *peerRec) BytesSent(n int)     { p.sent.Add(int64(n)) }
func (p *peerRec) BytesReceived(n int) { p.recv.Add(int64(n)) }

func (p *peerRec) stateList() []qrpc.PeerState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]qrpc.PeerState(nil), p.states...)
}

// tally runs load until the test ends (or stop), counting successes and
// keeping the failures in order.
type tally struct {
	oks   atomic.Int64
	mu    sync.Mutex
	fails []error
	stop  func()
}

func startTally(t *testing.T, workers int, call func() error) *tally {
	ty := &tally{}
	stopc := make(chan struct{})
	wg := load(workers, stopc, call, func(err error, _ time.Time) {
		if err == nil {
			ty.oks.Add(1)
			return
		}
		ty.mu.Lock()
		ty.fails = append(ty.fails, err)
		ty.mu.Unlock()
	})
	var once sync.Once
	ty.stop = func() { once.Do(func() { close(stopc); wg.Wait() }) }
	t.Cleanup(ty.stop)
	return ty
}

// failures returns the failures so far.
func (ty *tally) failures() []error {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	return append([]error(nil), ty.fails...)
}

// load runs calls from workers goroutines until stop is closed and
// reports each outcome to f.
func load(workers int, stop <-chan struct{}, call func() error, f func(err error, at time.Time)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := call()
				f(err, time.Now())
			}
		}()
	}
	return &wg
}

// logCapture is a slog.Handler that keeps messages with their "addr".
type logCapture struct {
	mu    sync.Mutex
	lines []string // "message|addr"
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	addr := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "addr" {
			addr = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, r.Message+"|"+addr)
	l.mu.Unlock()
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

// count counts lines with message msg (and addr, unless empty).
func (l *logCapture) count(msg, addr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		m, a, _ := strings.Cut(s, "|")
		if m == msg && (addr == "" || a == addr) {
			n++
		}
	}
	return n
}

// progress waits until count has grown by n from its value now, or fails
// after within (a bound only: the window a negative check holds over is
// the n outcomes, not a time). until, when not nil, ends the wait early
// when it holds (an end the scenario sets, e.g. an ejection's).
func progress(t *testing.T, what string, count func() int64, n int64, within time.Duration, until func() bool) {
	t.Helper()
	from := count()
	if !testwait.For(within, func() bool { return count()-from >= n || until != nil && until() }) {
		t.Fatalf("%s: %d of %d in %v", what, count()-from, n, within)
	}
}
