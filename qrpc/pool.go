package qrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// Balance is how a Pool spreads calls over its servers.
type Balance uint8

const (
	// RoundRobin takes the servers that are up in turn (the default).
	RoundRobin Balance = iota
	// LeastInflight takes the server with the fewest calls in flight; ties
	// go round-robin.
	LeastInflight
	// Hash sends calls with the same Call.HashKey to the same server while
	// it is up (rendezvous hashing: when a server joins or leaves, only the
	// keys that it wins or held move, about 1/N of them). A call without a
	// key goes round-robin.
	Hash
	// P2C is the power of two choices: of two servers drawn at random, the
	// one with the lower peak-EWMA answer time × (calls in flight + 1)
	// takes the call (linkerd's and Finagle's balancer; the EWMA decays
	// with a 10 s time constant).
	P2C
)

var balanceNames = [...]string{"round_robin", "least_inflight", "hash", "p2c"}

func (b Balance) String() string {
	if int(b) < len(balanceNames) {
		return balanceNames[b]
	}
	return "unknown"
}

// ParseBalance reads "round_robin", "least_inflight", "hash" or "p2c".
func ParseBalance(s string) (Balance, error) {
	for i, n := range balanceNames {
		if s == n {
			return Balance(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown balance %q (round_robin, least_inflight, hash or p2c)", ErrBadConfig, s)
}

// Failure is a kind of transport failure, for PoolConfig.EjectOn.
type Failure uint8

const (
	// FailConnect: the server could not be reached (dial, TLS, or the
	// client re-dialling it).
	FailConnect Failure = 1 << iota
	// FailReset: the connection or stream was lost with calls in flight.
	FailReset
	// FailTimeout: an attempt got no answer in time (its try timeout or
	// the call's deadline).
	FailTimeout

	failAll = FailConnect | FailReset | FailTimeout
)

// failureOf classifies a transport failure (0: not one).
func failureOf(err error) Failure {
	switch {
	case errors.Is(err, ErrTimeout):
		return FailTimeout
	case errors.Is(err, ErrConnLost):
		return FailReset
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrDial):
		return FailConnect
	}
	return 0
}

// Hedge sends copies of a call that has not been answered after Delay to
// other servers, at most Max copies besides the first; the first answer
// (any code) wins and the other copies are cancelled. Only for calls
// that may run twice.
type Hedge struct {
	// Delay before each copy. With P95 it is the pool's measured 95th
	// percentile answer time instead (at least 1 ms; no copy is sent
	// until the pool has that many answers to measure it from).
	Delay time.Duration
	P95   bool
	// Max copies besides the first: 0 is none (for Call.Hedge: the
	// pool's), a negative value none at all; at most MaxHedge.
	Max int
}

// MaxHedge bounds Hedge.Max.
const MaxHedge = limits.Hedge

// MaxRetries bounds PoolConfig.Retries and Call.Retries.
const MaxRetries = limits.Retries

// HealthCheck is the optional active check: a unary call of Method to
// every server every Interval, each given Timeout. A server that fails it
// counts a passive failure; an ejected one that answers (any code) is back
// at once.
type HealthCheck struct {
	Method   string
	Interval time.Duration // default 2 s when Method is set
	Timeout  time.Duration // default 500 ms
}

// PoolConfig configures a Pool: Config is used for every server's client.
type PoolConfig struct {
	Config

	Balance Balance
	// Failures is how many transport failures in a row (timeout, connect
	// error, connection lost; never a non-zero code) eject a server
	// (default 3).
	Failures int
	// Eject is the first ejection's length (default 10 s); each failed
	// trial call after one doubles it, up to 10× Eject.
	Eject time.Duration
	// Stall bounds the stall limit (default 200 ms; negative: no stall):
	// a server that has had calls in flight, and no answer (any code),
	// while the pool's other servers went on answering for the limit, is
	// stalled. The limit is Stall, or 8 × the server's typical answer time
	// (at least 60 ms) when that is less. The silence is counted in the
	// time the pool went on getting answers, a gap between two answers
	// counting for at most activeGapCap: while this process (or the
	// machine) stands still, no server's silence grows. When every call in
	// flight is on the silent server (no other server is asked, so none
	// answers), its silence is judged on the monotonic clock, once another
	// server has answered since its last sign of life.
	// New calls go to other servers while it is (a soft skip: with no
	// other server to take a call, it still takes it); its calls in
	// flight keep their deadlines. Once seen (by a pick or Peers) the
	// verdict holds until the server answers or has no call left in
	// flight: every pick after it honours it. It is not an ejection:
	// Failures still decides that. A server killed or frozen under load
	// is found in Stall instead of the calls' timeout, so that far fewer
	// calls get caught on it; the price is that a server whose only calls
	// in flight run longer than the limit gets no new ones until one ends.
	Stall time.Duration
	Check HealthCheck
	// Retries is the default number of extra attempts, on another server,
	// for a call that failed in transport after it may have run (default
	// 0: such calls are not retried). Call.Retries overrides it.
	Retries int
	// TryTimeout bounds each attempt (0: off): an attempt gets
	// min(TryTimeout, the time left), and one that passes it is a timeout
	// of that server; with retries left the call goes on to another
	// server. Call.TryTimeout overrides it.
	TryTimeout time.Duration
	// Hedge is the default hedging of calls (zero: none); Call.Hedge
	// overrides it.
	Hedge Hedge
	// RetryRatio and RetryMinPerS are the retry budget (Finagle's): over
	// the last 10 s, the retries and hedged copies of the pool's calls
	// stay within RetryMinPerS × 10 + RetryRatio × its calls. A call
	// that would go over fails with its own error, marked "retry budget
	// exhausted". 0 takes the defaults (0.2 and 10), negative is 0.
	RetryRatio   float64
	RetryMinPerS int
	// EjectOn is the transport failures that count against a server's
	// health (0: all of them).
	EjectOn Failure
	// Resolve re-resolves the host names among the addresses this often
	// (0: once, at DialPool).
	Resolve time.Duration
	// Resolver ("host:port", UDP DNS) replaces the system's resolver.
	Resolver string
	// Throttle is client-side adaptive throttling (zero: off).
	Throttle Throttle
	// Observer is told about every server's calls and states (nil: none).
	// It is this module's metrics recorder (internal/observe): not for
	// use outside it.
	Observer observe.Observer
}

// ErrNoServer: every server of a pool is down (ejected or not connected).
// The error returned also matches ErrUnavailable.
var ErrNoServer = errors.New("no server up")

// NoServerError is the fast failure of a call when no server is up.
type NoServerError struct {
	Ejected, Connecting int
}

func (e *NoServerError) Error() string {
	return fmt.Sprintf("%v: %v (%d ejected, %d connecting)", ErrUnavailable, ErrNoServer, e.Ejected, e.Connecting)
}

// Is makes errors.Is match both ErrNoServer and ErrUnavailable.
func (e *NoServerError) Is(target error) bool {
	return target == ErrNoServer || target == ErrUnavailable
}

const (
	defaultFailures = 3
	defaultEject    = 10 * time.Second
	// defaultStall: well above a typical call's latency, well below
	// typical timeouts (1-5 s), so that a silent server is left in a
	// fraction of them; the server's own answer time shortens it
	// (peer.stallLimit).
	defaultStall = 200 * time.Millisecond
	// A server whose calls are answered fast is found stalled sooner:
	// after stallFactor × its peak-EWMA answer time, but never under
	// stallFloor. On a 2-CPU machine beside a busy loop per CPU, with 50
	// calls in flight over three healthy servers, a flat 25 ms limit
	// (without the check that other servers answer, peer.stalled) logged
	// a stall of a healthy server 5 times in 30 s, and this rule none
	// (nginx/tail_test.go, TestNoFalseStalls); a server frozen under
	// load is still skipped about 160 ms after it stops.
	stallFactor = 8
	stallFloor  = 60 * time.Millisecond
	// activeGapCap: the most a gap between two answers of the pool counts
	// for in a server's silence. A loaded pool's answers come every few
	// milliseconds; a longer gap is this process or the machine standing
	// still (or a pool with little in flight), which is no server's
	// silence: after a pause of seconds, a server gets nearly its whole
	// limit to answer again.
	activeGapCap   = 10 * time.Millisecond
	maxEjectFactor = 10
	// The retry budget's defaults (Finagle's).
	defaultRetryRatio   = 0.2
	defaultRetryMinPerS = 10
	// maxPeers bounds a pool (names may resolve to many addresses).
	maxPeers = limits.Addrs
)

func (c *PoolConfig) populate() (PoolConfig, Config, error) {
	var pc PoolConfig
	if c != nil {
		pc = *c
	}
	conf, err := pc.Config.populate()
	if err != nil {
		return pc, conf, err
	}
	if pc.Failures == 0 {
		pc.Failures = defaultFailures
	}
	if pc.Eject == 0 {
		pc.Eject = defaultEject
	}
	switch {
	case pc.Stall == 0:
		pc.Stall = defaultStall
	case pc.Stall < 0:
		pc.Stall = -1
	}
	if pc.Check.Method != "" {
		if pc.Check.Interval == 0 {
			pc.Check.Interval = 2 * time.Second
		}
		if pc.Check.Timeout == 0 {
			pc.Check.Timeout = 500 * time.Millisecond
		}
	}
	if pc.Observer == nil {
		pc.Observer = observe.Nop{}
	}
	switch {
	case pc.RetryRatio == 0:
		pc.RetryRatio = defaultRetryRatio
	case pc.RetryRatio < 0:
		pc.RetryRatio = 0
	}
	switch {
	case pc.RetryMinPerS == 0:
		pc.RetryMinPerS = defaultRetryMinPerS
	case pc.RetryMinPerS < 0:
		pc.RetryMinPerS = 0
	}
	if pc.EjectOn == 0 {
		pc.EjectOn = failAll
	}
	switch {
	case pc.Balance > P2C:
		return pc, conf, fmt.Errorf("%w: unknown balance %d", ErrBadConfig, pc.Balance)
	case pc.Failures < 1:
		return pc, conf, fmt.Errorf("%w: health failures must be at least 1, got %d", ErrBadConfig, pc.Failures)
	case pc.Eject < 0:
		return pc, conf, fmt.Errorf("%w: negative ejection time", ErrBadConfig)
	case pc.Check.Interval < 0 || pc.Check.Timeout < 0:
		return pc, conf, fmt.Errorf("%w: negative health check interval or timeout", ErrBadConfig)
	case pc.Retries < 0 || pc.Retries > MaxRetries:
		return pc, conf, fmt.Errorf("%w: retries must be 0..%d, got %d", ErrBadConfig, MaxRetries, pc.Retries)
	case pc.TryTimeout < 0:
		return pc, conf, fmt.Errorf("%w: negative try timeout", ErrBadConfig)
	case pc.Hedge.Max < 0 || pc.Hedge.Max > MaxHedge || pc.Hedge.Delay < 0:
		return pc, conf, fmt.Errorf("%w: hedge max must be 0..%d and its delay >= 0", ErrBadConfig, MaxHedge)
	case pc.EjectOn&^failAll != 0:
		return pc, conf, fmt.Errorf("%w: unknown failure kinds 0x%x", ErrBadConfig, pc.EjectOn&^failAll)
	case pc.Resolve < 0:
		return pc, conf, fmt.Errorf("%w: negative resolve interval", ErrBadConfig)
	}
	if err := pc.Throttle.validate(); err != nil {
		return pc, conf, err
	}
	if pc.Resolver != "" {
		if _, _, err := net.SplitHostPort(pc.Resolver); err != nil {
			return pc, conf, fmt.Errorf("%w: resolver %q: %v", ErrBadConfig, pc.Resolver, err)
		}
	}
	return pc, conf, nil
}

// Pool is a client of several qrpc servers: calls are balanced over the
// servers that are up, servers that fail are ejected for a while, calls
// that were never sent go to another server, and host names are
// re-resolved. With one address it behaves as a Client. Safe for
// concurrent use.
type Pool struct {
	cfg      PoolConfig
	conf     Config // every server's client config, populated
	log      *slog.Logger
	observed bool // cfg.Observer is not observe.Nop

	// set is the servers that take calls, read without a lock on the call
	// path and replaced (copy-on-write) when membership changes.
	set     atomic.Pointer[peerSet]
	rr      atomic.Uint32
	rrExtra atomic.Uint32 // turns of retries and copies (choose)
	// lastAnswer is when a server of the pool last answered (monoNS);
	// active is the pool's answer clock (ns): the time during which the
	// pool went on getting answers, each gap between answers counting for
	// at most activeGapCap. A server's silence is measured on it
	// (pool_peer.go).
	lastAnswer atomic.Int64
	active     atomic.Int64
	inflight   atomic.Int64 // calls in flight on all the servers
	budget     *retryBudget
	lat        latencyHist // answer times, for hedging at the p95
	throttle   *throttler  // nil: off
	clk        clock       // realClock{}; a test's own (export_test.go)
	share      shareState  // other views' verdicts and roles (pool_share.go)
	hostOff    int64       // CLOCK_MONOTONIC - monoNS (hostNS)

	// hmu serialises the transitions of the servers' health
	// (pool_health.go): the last-server-up rule reads the others.
	hmu sync.Mutex

	mu       sync.Mutex // membership: targets, peers, draining
	targets  []target
	peers    map[string]*peer // in set
	draining map[string]*peer // removed by re-resolution, finishing calls
	resolver *net.Resolver
	hasSRV   bool // an SRV name among the targets: the set has tiers

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
}

type peerSet struct {
	peers []*peer
	// tiers is the servers by SRV priority, lowest first (one tier when
	// the pool has no SRV name): a call goes to the first tier that has a
	// server able to take it.
	tiers []*tier
}

// target is one configured address: a literal IP, a name to resolve, or
// an SRV name (host; no port: each record gives its own).
type target struct {
	host, port string
	literal    bool
	srv        bool
}

// DialPool connects to the servers at addrs ("host:port"; a host name
// stands for all its A and AAAA addresses; an SRV name,
// "_service._proto.name" without a port, for the addresses of its
// records' targets, on their ports, with their priorities and weights:
// see tier). With a single address it
// returns once connected, or the dial error, as Dial does; with several,
// once one server is up, or with the first server's error when none could
// be reached.
func DialPool(ctx context.Context, addrs []string, cfg *PoolConfig) (*Pool, error) {
	pc, conf, err := cfg.populate()
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no address", ErrBadConfig)
	}
	seen := make(map[string]bool, len(addrs))
	var targets []target
	hasSRV := false
	for _, a := range addrs {
		if isSRVName(a) {
			if seen[a] {
				return nil, fmt.Errorf("%w: duplicate address %q", ErrBadConfig, a)
			}
			seen[a] = true
			targets = append(targets, target{host: a, srv: true})
			hasSRV = true
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("%w: address %q: want host:port", ErrBadConfig, a)
		}
		if seen[a] {
			return nil, fmt.Errorf("%w: duplicate address %q", ErrBadConfig, a)
		}
		seen[a] = true
		_, perr := netipParse(host)
		targets = append(targets, target{host: host, port: port, literal: perr == nil})
	}
	p := &Pool{
		cfg:      pc,
		conf:     conf,
		log:      conf.Logger,
		targets:  targets,
		hasSRV:   hasSRV,
		peers:    map[string]*peer{},
		draining: map[string]*peer{},
		resolver: newResolver(pc.Resolver),
		budget:   newRetryBudget(pc.RetryRatio, pc.RetryMinPerS),
		throttle: newThrottler(pc.Throttle),
		clk:      realClock{},
		hostOff:  hostOffset(),
	}
	_, nop := pc.Observer.(observe.Nop)
	p.observed = !nop
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.set.Store(&peerSet{})

	want, names, meta, err := p.resolve(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.noteResolved(want, names, meta)
	p.mu.Unlock()
	if len(want) == 1 {
		// One server: dial it now, as Dial does, and fail as it fails.
		if err := p.addSync(ctx, want[0], names, meta); err != nil {
			p.cancel()
			return nil, err
		}
	} else {
		p.mu.Lock()
		err := p.apply(want, names, meta)
		n := len(p.peers)
		p.mu.Unlock()
		if n == 0 {
			// Every server refused by its configuration (bad TLS
			// material): the connect fails as a single address's does.
			_ = p.Close()
			if err == nil {
				err = fmt.Errorf("%w: no server", ErrBadConfig)
			}
			return nil, err
		}
		if err := p.awaitOne(ctx); err != nil {
			_ = p.Close()
			return nil, err
		}
	}
	p.startBackground()
	return p, nil
}

// awaitOne waits until a server is up, or every server has failed a dial.
// Once one is up it gives the others a little longer (twice the time the
// first took, at least 100 ms) so that the first calls are spread, without
// making a pool with a dead server slow to connect.
func (p *Pool) awaitOne(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	began := time.Now()
	var graceEnd time.Time
	for {
		var firstErr error
		failed, up := 0, 0
		set := p.set.Load()
		for _, pr := range set.peers {
			if pr.c.up() {
				up++
			} else if e := pr.c.lastDialErr(); e != nil {
				failed++
				if firstErr == nil {
					firstErr = e
				}
			}
		}
		switch {
		case up+failed == len(set.peers) && up > 0:
			return nil
		case failed == len(set.peers):
			return firstErr
		case up > 0 && graceEnd.IsZero():
			graceEnd = time.Now().Add(max(100*time.Millisecond, 2*time.Since(began)))
		case up > 0 && time.Now().After(graceEnd):
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			if up > 0 {
				return nil
			}
			return fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		}
	}
}

func (p *Pool) startBackground() {
	if p.cfg.Resolve > 0 && p.hasNames() {
		p.wg.Add(1)
		safego.Go("pool resolver", p.resolveLoop, nil)
	}
	if p.cfg.Check.Method != "" && p.cfg.Check.Interval > 0 {
		p.wg.Add(1)
		safego.Go("pool prober", p.checkLoop, nil)
	}
}

// Event sends a one-way event to a server that is up.
func (p *Pool) Event(method []byte, headers [][]byte, body []byte) error {
	return p.SendEvent(&Call{Method: method, Headers: headers, Body: body})
}

// SendEvent sends call as a one-way event (HashKey picks the server with
// Hash balancing; Deadline and Retries are ignored). An event that cannot
// be sent to one server goes to another.
func (p *Pool) SendEvent(call *Call) error {
	if p.closed.Load() {
		return ErrClosed
	}
	var ex exclude
	var last *peer
	var lastErr error
	// An event has one outcome, whatever the servers it tried: sent by the
	// server that took it, else dropped on the last server that refused
	// it. One no server was chosen for is not counted, as calls are not.
	defer func() {
		if last != nil {
			last.obs.EventDone(call.Method, lastErr)
		}
	}()
	// Each server at most once: the set may change meanwhile, but the
	// loop ends whatever the servers answer.
	for range len(p.set.Load().peers) + 1 {
		clk := pickClock{src: p.clk}
		pr, trial := p.pick(call.HashKey, &ex, false, &clk)
		if pr == nil {
			return p.refused(lastErr)
		}
		err := pr.c.Event(call.Method, call.Headers, call.Body)
		// An event has no answer, so no verdict on the server: the
		// trial goes back for a call that has one.
		p.giveBack(pr, trial)
		last, lastErr = pr, err
		if err == nil || !neverSent(err) {
			return err
		}
		ex.add(pr)
	}
	return p.refused(lastErr)
}

// Unary sends a request and waits for its response, as Client.Unary does.
func (p *Pool) Unary(ctx context.Context, method string, body []byte, headers ...[]byte) (*Response, error) {
	return p.Do(ctx, &Call{Method: []byte(method), Headers: headers, Body: body})
}

// Do runs call and waits for its response. The context's deadline, when
// earlier than call.Deadline (or call.Deadline is zero), is the call's
// deadline; call itself is not changed.
func (p *Pool) Do(ctx context.Context, call *Call) (*Response, error) {
	return unaryVia(ctx, call, p.Start)
}

// Stats sums the counters of every server's client.
func (p *Pool) Stats() Stats {
	var st Stats
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range []map[string]*peer{p.peers, p.draining} {
		for _, pr := range m {
			s := pr.c.Stats()
			st.InFlight += s.InFlight
			st.Reconnects += s.Reconnects
		}
	}
	return st
}

// Conns reports the number of live QUIC connections of the pool.
func (p *Pool) Conns() int {
	n := 0
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range []map[string]*peer{p.peers, p.draining} {
		for _, pr := range m {
			n += pr.c.liveConns()
		}
	}
	return n
}

// PeerInfo describes one server of a pool.
type PeerInfo struct {
	Addr         string
	State        PeerState
	Inflight     int
	Calls        uint64 // attempts sent to it
	Failures     int    // transport failures in a row
	EjectedUntil time.Time
	// Stalled: calls in flight and no answer for PoolConfig.Stall; new
	// calls go elsewhere while another server can take them.
	Stalled bool
	// Priority and Weight are the server's SRV record's (0 and 1 for an
	// address not from an SRV name; a weight of 0 reads 1).
	Priority, Weight int
}

// Peers lists the pool's servers, draining ones included, by address.
func (p *Pool) Peers() []PeerInfo {
	p.mu.Lock()
	out := make([]PeerInfo, 0, len(p.peers)+len(p.draining))
	for _, m := range []map[string]*peer{p.peers, p.draining} {
		for _, pr := range m {
			out = append(out, pr.info())
		}
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// Close stops the pool's goroutines and closes every server's client;
// pending calls fail with ErrClosed. It is idempotent.
func (p *Pool) Close() error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	var all []*peer
	for _, m := range []map[string]*peer{p.peers, p.draining} {
		for _, pr := range m {
			all = append(all, pr)
		}
	}
	p.mu.Unlock()
	// Each client may linger up to CloseLinger: close them side by side.
	var wg sync.WaitGroup
	for _, pr := range all {
		wg.Add(1)
		safego.Go("pool close", func() {
			defer wg.Done()
			_ = pr.c.Close()
			// The observer hears of the end (its gauges count servers of
			// open pools); the log does not: closing is the owner's doing.
			p.hmu.Lock()
			h := *pr.h.Load()
			h.removed, h.draining, h.trial = true, false, 0
			pr.h.Store(&h)
			p.hmu.Unlock()
			if PeerState(pr.state.Swap(uint32(PeerRemoved))) != PeerRemoved {
				pr.obs.StateChanged(PeerRemoved)
			}
		}, nil)
	}
	wg.Wait()
	return nil
}

// neverSent reports errors of Client.Start/Event after which the request
// was certainly not sent: another server may take it.
func neverSent(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrConnLost) ||
		errors.Is(err, ErrClosed) || errors.Is(err, ErrQueueFull)
}

// transportFailure reports outcomes that count against a server's health:
// timeouts, connect errors, lost connections and streams. A response with
// a non-zero code is an answer, not a failure.
func transportFailure(err error) bool {
	return errors.Is(err, ErrTimeout) || errors.Is(err, ErrConnLost) ||
		errors.Is(err, ErrUnavailable) || errors.Is(err, ErrDial)
}

// refused is the error of a call that no server took: when the servers
// tried all had their send queues full, that (nothing was sent); else
// there was no server to take it.
func (p *Pool) refused(lastErr error) error {
	if errors.Is(lastErr, ErrQueueFull) {
		return lastErr
	}
	return p.noServer(lastErr)
}

func (p *Pool) noServer(lastErr error) error {
	set := p.set.Load()
	if len(set.peers) == 1 && lastErr != nil {
		return lastErr // one server: its own error, as a Client gives
	}
	var e NoServerError
	for _, pr := range set.peers {
		if pr.h.Load().ejected() {
			e.Ejected++
		} else {
			e.Connecting++
		}
	}
	return &e
}

// exclude is the servers a call has tried, kept out of its next pick: the
// first few inline (no allocation on the usual path), the rest in more. It
// forgets none, so a call tries each server at most once before it may go
// back to one (a retry's relax).
type exclude struct {
	n     int
	peers [8]*peer
	more  []*peer
}

func (e *exclude) add(p *peer) {
	if e.has(p) {
		return
	}
	if e.n < len(e.peers) {
		e.peers[e.n] = p
	} else {
		e.more = append(e.more, p)
	}
	e.n++
}

func (e *exclude) has(p *peer) bool {
	for i := 0; i < min(e.n, len(e.peers)); i++ {
		if e.peers[i] == p {
			return true
		}
	}
	for _, q := range e.more {
		if q == p {
			return true
		}
	}
	return false
}

// unaryVia starts call through start and waits for its outcome.
func unaryVia(ctx context.Context, call *Call, start func(*Call, Done) (Pending, error)) (*Response, error) {
	type result struct {
		resp *Response
		err  error
	}
	ch := make(chan result, 1)
	// The earlier deadline is the call's: a context that ends first is a
	// deadline the caller gave up at, and the call must time out there
	// (an outcome counted as a timeout), not be cancelled (no outcome).
	// on a copy: the caller's Call may be reused, or shared by goroutines
	if d, ok := ctx.Deadline(); ok && (call.Deadline.IsZero() || d.Before(call.Deadline)) {
		c := *call
		c.Deadline = d
		call = &c
	}
	pend, err := start(call, func(resp *Response, err error) {
		if err != nil {
			ch <- result{err: err}
			return
		}
		ch <- result{resp: resp.CloneVT()}
	})
	if err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-ctx.Done():
		if pend.Cancel() {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
			}
			return nil, ctx.Err()
		}
		r := <-ch // done is running or ran: take its result
		return r.resp, r.err
	}
}
