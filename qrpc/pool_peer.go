package qrpc

import (
	"context"
	"math"
	"sync/atomic"
	"time"
)

// peer is one server of a pool: its client, its health and its counters.
// Everything the call path reads is atomic.
type peer struct {
	pool *Pool
	addr string
	name string // the TLS server name its client checks
	c    backend
	obs  peerObserver
	seed uint64 // rendezvous hashing weight seed, from addr
	// meta is the SRV priority (high 16 bits) and weight (low 16 bits)
	// the server was last resolved with (pool_tier.go).
	meta atomic.Uint32
	// split is how many addresses share the record's weight (share).
	split atomic.Uint32

	inflight atomic.Int64
	calls    atomic.Uint64
	// h is the server's health: replaced only by Pool.transition
	// (pool_health.go), read with one load.
	h     atomic.Pointer[health]
	state atomic.Uint32 // last PeerState reported

	// progress is the busy server's last sign of life, on the pool's
	// answer clock (Pool.active): its last answer, or when it went from
	// idle to busy. A server with calls in flight and no progress while
	// the pool's answer clock moved on by its stall limit is stalled: a
	// server killed or frozen under load looks like that long before its
	// calls time out.
	progress atomic.Int64
	// progressAt is the same sign of life on the monotonic clock (monoNS),
	// for when the answer clock cannot judge (stalled).
	progressAt atomic.Int64
	// stallSeen is the stall verdict, once seen (by a pick or Peers): it
	// holds until the server answers (answered) or starts a new busy
	// period (startCall). stallLogged is when a stall was last logged
	// (monoNS), stallLoud whether the current stall was.
	stallSeen   atomic.Bool
	stallLoud   atomic.Bool
	stallLogged atomic.Int64

	// ewma is the server's peak-EWMA answer time (ns; 0 before the first
	// sample), last updated at ewmaAt (monoNS): a sample above it replaces
	// it at once, one below pulls it down with a 10 s time constant. p2c
	// balancing and the stall limit read it.
	ewma   atomic.Int64
	ewmaAt atomic.Int64
}

// ewmaDecay is the peak EWMA's time constant (linkerd's).
const ewmaDecay = 10 * time.Second

// pickClock reads the time at most once per pick, and only when a server
// needs it (an ejected one, or one with calls in flight). A call's attempt
// presets it with the time it reads anyway.
type pickClock struct {
	t   time.Time
	src clock // the pool's; set by pick when the caller left it nil
}

func (c *pickClock) now() time.Time {
	if c.t.IsZero() {
		if c.src == nil {
			c.src = realClock{}
		}
		c.t = c.src.Now()
	}
	return c.t
}

// backend is what a pool needs of a server's client: *Client, or the
// simulation's stand-in (poolsim_test.go).
type backend interface {
	up() bool
	Start(call *Call, done Done) (Pending, error)
	Event(method []byte, headers [][]byte, body []byte) error
	Unary(ctx context.Context, method string, body []byte, headers ...[]byte) (*Response, error)
	Close() error
	Stats() Stats
	liveConns() int
	lastDialErr() error
}

// stallLogEvery bounds the stall lines of one server in the log: a server
// whose calls are slow may go in and out of a stall often.
const stallLogEvery = 10 * time.Second

func newPeer(p *Pool, addr string) *peer {
	pr := &peer{pool: p, addr: addr, seed: mix64(fnv64(addr))}
	pr.meta.Store(1) // priority 0, weight 1 until resolved otherwise
	pr.h.Store(&health{ejectFor: int64(p.cfg.Eject)})
	pr.obs = p.cfg.Observer.Peer(addr)
	pr.state.Store(uint32(PeerConnecting))
	pr.obs.StateChanged(PeerConnecting)
	return pr
}

// gone tells the observer of the end of a server that never joined the
// pool (its client could not be made or dialled): the gauges it counted
// as connecting forget it.
func (pr *peer) gone() {
	h := *pr.h.Load()
	h.removed = true
	pr.h.Store(&h)
	if PeerState(pr.state.Swap(uint32(PeerRemoved))) != PeerRemoved {
		pr.obs.StateChanged(PeerRemoved)
	}
}

// startCall counts a call sent at now. A server going from idle to busy
// starts its stall clock then: the time it was idle is not silence.
func (pr *peer) startCall(now time.Time) {
	if pr.inflight.Load() == 0 {
		pr.progress.Store(pr.pool.active.Load())
		pr.progressAt.Store(monoNS(now))
		pr.stallSeen.Store(false) // a verdict on the last busy period
	}
	pr.pool.inflight.Add(1)
	pr.inflight.Add(1)
	pr.calls.Add(1)
	pr.obs.InflightAdd(1)
}

func (pr *peer) endCall() {
	pr.inflight.Add(-1)
	pr.pool.inflight.Add(-1)
	pr.obs.InflightAdd(-1)
}

// answered records a sign of life at now: an answer (any code) to a call
// that took d, or to the active check (d = 0: no latency sample).
func (pr *peer) answered(now time.Time, d time.Duration) {
	ns := monoNS(now)
	p := pr.pool
	pr.progress.Store(p.advance(ns))
	pr.progressAt.Store(ns)
	if pr.stallSeen.Load() && pr.stallSeen.CompareAndSwap(true, false) && pr.stallLoud.Swap(false) {
		p.log.Info("qrpc server answering again", "addr", pr.addr)
	}
	if d > 0 {
		pr.observeLatency(ns, d)
		p.lat.answer(d, pr.calls.Load())
	}
}

// advance moves the pool's answer clock to an answer at ns (monoNS) and
// returns it: by the gap since the last answer, at most activeGapCap. One
// store per millisecond at most: a line every answer shares.
func (p *Pool) advance(ns int64) int64 {
	last := p.lastAnswer.Load()
	if last != 0 && ns-last <= int64(time.Millisecond) || !p.lastAnswer.CompareAndSwap(last, ns) {
		return p.active.Load()
	}
	if last == 0 || ns <= last {
		return p.active.Load()
	}
	return p.active.Add(min(ns-last, int64(activeGapCap)))
}

// observeLatency folds a call's time d, ended at now (monoNS), into the
// peak EWMA. Racing updates may drop a sample; an estimate is enough.
func (pr *peer) observeLatency(now int64, d time.Duration) {
	old := pr.ewma.Load()
	last := pr.ewmaAt.Swap(now)
	if old == 0 || int64(d) >= old {
		pr.ewma.Store(max(int64(d), 1))
		return
	}
	w := decay(now - last)
	pr.ewma.Store(max(int64(float64(old)*w+float64(d)*(1-w)), 1))
}

// decay is the peak EWMA's weight of the past after dt ns: e^(-dt/τ). For
// the short gaps between the answers of a busy server (dt under τ/1000,
// 10 ms) it is 1 - dt/τ, within 5e-7 of it, without math.Exp on the
// call path.
func decay(dt int64) float64 {
	if dt <= 0 {
		return 1
	}
	x := float64(dt) / float64(ewmaDecay)
	if x < 1e-3 {
		return 1 - x
	}
	return math.Exp(-x)
}

// cost is p2c's load of a server at now (monoNS): its peak EWMA, decayed
// over the time since its last sample (a server that got no calls for
// being slow is tried again), × (calls in flight + 1).
func (pr *peer) cost(now int64) float64 {
	e := float64(pr.ewma.Load())
	if e > 0 {
		e *= decay(now - pr.ewmaAt.Load())
	}
	return e * float64(pr.inflight.Load()+1)
}

// stalled reports whether pr has had calls in flight and no sign of life
// while the pool's answer clock moved on by more than its stall limit:
// the other servers went on answering all that time (when this process is
// starved of CPU, or the machine stands still, no answer comes from any
// server and the clock does not move; when one server freezes under load,
// the others answer on). That clock stands still too when every call in
// flight is on pr (clients caught on it wait, and ask no other server):
// then the monotonic clock judges, once another server has answered since
// pr's last sign of life. The first time it holds, the verdict is kept
// (noteStall) and every later call sees it, until pr answers or goes
// idle. in is its inflight count; stall is PoolConfig.Stall (ns; <= 0:
// never).
func (pr *peer) stalled(in int64, clk *pickClock, stall int64) bool {
	if stall <= 0 || in <= 0 {
		return false
	}
	if pr.stallSeen.Load() {
		return true
	}
	p := pr.pool
	limit := pr.stallLimit(stall)
	if p.active.Load()-pr.progress.Load() <= limit {
		if p.inflight.Load() > in {
			return false // others have calls to answer: their answers judge
		}
		last := pr.progressAt.Load()
		if monoNS(clk.now())-last <= limit || p.lastAnswer.Load() <= last {
			return false
		}
	}
	pr.noteStall(clk)
	return true
}

// stallLimit is how long pr may go without answering while busy before
// it is stalled (ns): Stall, or less when the server answers fast.
// Clients that call again as soon as they have an answer come back every
// few answer times, and each time one in n of them is caught on a silent
// server: waiting the whole Stall would let most of them be caught.
func (pr *peer) stallLimit(stall int64) int64 {
	e := pr.ewma.Load()
	if e == 0 {
		return stall
	}
	return min(stall, max(int64(stallFloor), stallFactor*e))
}

// noteStall keeps the verdict that pr is stalled; the first time (of this
// stall), the log hears of it, at most once per stallLogEvery.
func (pr *peer) noteStall(clk *pickClock) {
	if pr.stallSeen.Load() || !pr.stallSeen.CompareAndSwap(false, true) {
		return
	}
	now := monoNS(clk.now())
	last := pr.stallLogged.Load()
	if last != 0 && now-last < int64(stallLogEvery) || !pr.stallLogged.CompareAndSwap(last, now) {
		return
	}
	pr.stallLoud.Store(true)
	pr.pool.log.Info("qrpc server stalled: calls in flight and no answer, new calls go to other servers",
		"addr", pr.addr, "for", time.Duration(now-pr.progressAt.Load()).Round(time.Millisecond),
		"inflight", pr.inflight.Load())
}

func (pr *peer) compute() PeerState {
	h := pr.h.Load()
	switch {
	case h.removed:
		return PeerRemoved
	case h.draining:
		return PeerDraining
	case h.ejected():
		return PeerEjected
	case pr.c == nil || !pr.c.up():
		return PeerConnecting
	}
	return PeerUp
}

// refresh reports a change of state to the observer, and to the log the
// changes an operator wants to see (never one per call).
func (pr *peer) refresh() {
	for {
		old := PeerState(pr.state.Load())
		now := pr.compute()
		if old == now {
			return
		}
		if !pr.state.CompareAndSwap(uint32(old), uint32(now)) {
			continue
		}
		pr.obs.StateChanged(now)
		log := pr.pool.log
		switch {
		case now == PeerEjected:
			h := pr.h.Load()
			log.Info("qrpc server ejected", "addr", pr.addr,
				"for", time.Duration(h.ejectFor), "until", wallAt(h.until, pr.pool.clk.Now()).Format(time.RFC3339Nano))
		case old == PeerEjected && (now == PeerUp || now == PeerConnecting):
			log.Info("qrpc server back", "addr", pr.addr, "state", now.String())
		case now == PeerDraining:
			log.Info("qrpc server removed, draining", "addr", pr.addr, "inflight", pr.inflight.Load())
		case now == PeerRemoved:
			log.Info("qrpc server removed", "addr", pr.addr)
		}
		return
	}
}

func (pr *peer) info() PeerInfo {
	in := PeerInfo{
		Addr:     pr.addr,
		State:    pr.compute(),
		Inflight: int(pr.inflight.Load()),
		Calls:    pr.calls.Load(),
		Failures: int(pr.h.Load().fails),
		Priority: int(pr.prio()),
		Weight:   int(pr.weight()),
	}
	clk := pickClock{src: pr.pool.clk}
	if u := pr.h.Load().until; u != 0 {
		in.EjectedUntil = wallAt(u, clk.now())
	}
	in.Stalled = pr.stalled(int64(in.Inflight), &clk, int64(pr.pool.cfg.Stall))
	return in
}

// FNV-1a, then a SplitMix64 finaliser: stable across processes (every
// nginx worker maps a key to the same server) and well spread.
func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func fnv64b(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
