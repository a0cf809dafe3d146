package qrpc

import (
	"cmp"
	"math"
	"sync/atomic"
	"time"
)

// peer is one server of a pool: its client, its health and its counters.
// Everything the call path reads is atomic.
type peer struct {
	pool *Pool
	addr string
	c    *Client
	obs  peerObserver
	seed uint64 // rendezvous hashing weight seed, from addr
	// meta is the SRV priority (high 16 bits) and weight (low 16 bits)
	// the server was last resolved with (pool_tier.go).
	meta atomic.Uint32

	inflight atomic.Int64
	calls    atomic.Uint64
	fails    atomic.Int32 // transport failures in a row
	// What a shared pool's other views learn of the run (pool_share.go):
	// failCount counts the failures that count for fails (ever,
	// wrapping), resets the runs this view ended (an answer after
	// failures, the server back), failAtReset is failCount at the last
	// reset and failShown failCount as View last reported it.
	failCount   atomic.Uint32
	resets      atomic.Uint32
	failAtReset atomic.Uint32
	failShown   atomic.Uint32

	// ejectedUntil is the end of the ejection (monoNS), 0 when
	// not ejected; it stays set past that time until a trial call (one at
	// a time: trial) or an active check answers. ejectFor is the length of
	// the next ejection.
	ejectedUntil atomic.Int64
	ejectFor     atomic.Int64
	trial        atomic.Bool

	draining atomic.Bool
	removed  atomic.Bool
	state    atomic.Uint32 // last PeerState reported

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

	// remoteStall is the end (monoNS) of another view's stall verdict
	// (pool_share.go); 0: none.
	remoteStall atomic.Int64
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

// stallLogEvery bounds the stall lines of one server in the log: a server
// whose calls are slow may go in and out of a stall often.
const stallLogEvery = 10 * time.Second

func newPeer(p *Pool, addr string) *peer {
	pr := &peer{pool: p, addr: addr, seed: mix64(fnv64(addr))}
	pr.meta.Store(1) // priority 0, weight 1 until resolved otherwise
	pr.ejectFor.Store(int64(p.cfg.Eject))
	pr.obs = p.cfg.Observer.Peer(addr)
	pr.state.Store(uint32(PeerConnecting))
	pr.obs.StateChanged(PeerConnecting)
	return pr
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
		if pr.calls.Load()&3 == 0 {
			p.lat.add(d)
		}
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
	switch {
	case pr.removed.Load():
		return PeerRemoved
	case pr.draining.Load():
		return PeerDraining
	case pr.ejectedUntil.Load() != 0:
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
			log.Info("qrpc server ejected", "addr", pr.addr,
				"for", time.Duration(pr.ejectFor.Load()), "until", wallAt(pr.ejectedUntil.Load(), pr.pool.clk.Now()).Format(time.RFC3339Nano))
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
		Failures: int(pr.fails.Load()),
		Priority: int(pr.prio()),
		Weight:   int(pr.weight()),
	}
	clk := pickClock{src: pr.pool.clk}
	if u := pr.ejectedUntil.Load(); u != 0 {
		in.EjectedUntil = wallAt(u, clk.now())
	}
	in.Stalled = pr.stalled(int64(in.Inflight), &clk, int64(pr.pool.cfg.Stall))
	return in
}

// eligible reports whether pr may take a call. An ejected server whose
// time is up may take one trial call (needTrial); the caller claims it.
func (pr *peer) eligible(clk *pickClock) (ok, needTrial bool) {
	if until := pr.ejectedUntil.Load(); until != 0 {
		if monoNS(clk.now()) < until || pr.trial.Load() {
			return false, false
		}
		return pr.c.up(), true
	}
	return pr.c.up(), false
}

// pick chooses the server for a call, or nil when none may take it. It
// takes no lock and allocates nothing: the set is an immutable snapshot,
// the rest atomics. With one server in the pool it is always that one
// (its client's own error then says why it cannot take the call).
// relax lets a retry go back to a server in ex when no other can take it.
// A stalled server is skipped softly: it takes the call only when no
// other server can.
func (p *Pool) pick(key []byte, ex *exclude, relax bool, clk *pickClock) (*peer, bool) {
	if clk.src == nil {
		clk.src = p.clk
	}
	set := p.set.Load()
	peers := set.peers
	n := len(peers)
	if n == 0 {
		return nil, false
	}
	if set.tiers != nil && n > 1 {
		return p.pickTiers(set.tiers, key, ex, relax, clk)
	}
	if n == 1 {
		pr := peers[0]
		if ex != nil && ex.has(pr) && !relax {
			return nil, false
		}
		if ok, trial := pr.eligible(clk); ok && trial {
			if pr.trial.CompareAndSwap(false, true) {
				return pr, true
			}
		}
		return pr, false
	}
	pr, trial := p.choose(peers, key, ex, clk)
	if pr == nil && relax && ex != nil && ex.n > 0 {
		pr, trial = p.choose(peers, key, nil, clk)
	}
	return pr, trial
}

func (p *Pool) choose(peers []*peer, key []byte, ex *exclude, clk *pickClock) (*peer, bool) {
	limit := int64(p.cfg.Stall)
	n := uint32(len(peers))
	// A retry, a hedged copy or a call moving on from a server that
	// refused it takes turns of its own: taking the first attempts' turns
	// would hand the server after the one it avoids an extra share (with
	// a slow server hedged around, that is the slow one).
	rr := &p.rr
	if ex != nil && ex.n > 0 {
		rr = &p.rrExtra
	}
	switch {
	case p.cfg.Balance == P2C:
		return p.chooseP2C(peers, ex, clk, limit, rr)
	case p.cfg.Balance == LeastInflight:
		return scanBest(peers, rr.Add(1), ex, clk, limit, func(pr *peer) int64 { return pr.inflight.Load() })
	case p.cfg.Balance == Hash && len(key) > 0:
		// rendezvous: the highest score wins (the lowest of its complement)
		kh := fnv64b(key)
		return scanBest(peers, 0, ex, clk, limit, func(pr *peer) uint64 { return ^mix64(kh ^ pr.seed) })
	}
	// Each probe takes a turn of its own: a server that is skipped uses up
	// its turns instead of handing them to its neighbour, which would get
	// twice its share.
	var i uint32
	stalls := false
	for range n {
		i = rr.Add(1)
		pr, trial, st := rrTake(peers[i%n], ex, clk, limit)
		if pr != nil {
			return pr, trial
		}
		stalls = stalls || st
	}
	for k := uint32(1); k < n; k++ {
		pr, trial, st := rrTake(peers[(i+k)%n], ex, clk, limit)
		if pr != nil {
			return pr, trial
		}
		stalls = stalls || st
	}
	if stalls {
		// Every server that may take the call is stalled: one of them
		// takes it rather than none, in turn (i moved on by n: i/n turns).
		for k := range n {
			if pr, trial, _ := rrTake(peers[(i/n+k)%n], ex, clk, 0); pr != nil {
				return pr, trial
			}
		}
	}
	return nil, false
}

// chooseP2C draws two servers and takes the cheaper (peer.cost). When a
// draw finds a server that may not take the call, it falls back to the
// cheapest of all that may; a stalled server only when no other can.
func (p *Pool) chooseP2C(peers []*peer, ex *exclude, clk *pickClock, limit int64, rr *atomic.Uint32) (*peer, bool) {
	n := uint64(len(peers))
	r := mix64(uint64(rr.Add(1)))
	a := peers[r%n]
	b := peers[(r%n+1+(r>>32)%(n-1))%n]
	now := monoNS(clk.now())
	if oka, ta, _ := takeable(a, ex, clk, limit); oka {
		pa := a
		if okb, tb, _ := takeable(b, ex, clk, limit); okb && b.cost(now) < a.cost(now) {
			pa, ta = b, tb
		}
		if !ta || pa.trial.CompareAndSwap(false, true) {
			return pa, ta
		}
	}
	// From the draw's first server on: ties (servers not measured yet) are
	// spread.
	return scanBest(peers, uint32(r%n), ex, clk, limit, func(pr *peer) float64 { return pr.cost(now) })
}

// scanBest returns the server with the lowest score among those that may
// take the call (a stalled one only when no other can), from peers[start]
// on, claiming its trial when it needs one; when another call claimed that
// trial first it looks again, at most len(peers) times.
func scanBest[S cmp.Ordered](peers []*peer, start uint32, ex *exclude, clk *pickClock, limit int64, score func(*peer) S) (*peer, bool) {
	n := uint32(len(peers))
	for range n {
		var best, slow *peer
		var bestTrial, slowTrial bool
		var bestS, slowS S
		for i := range n {
			pr := peers[(start+i)%n]
			if ex != nil && ex.has(pr) {
				continue
			}
			ok, trial := pr.eligible(clk)
			if !ok {
				continue
			}
			sc := score(pr)
			if pr.stalled(pr.inflight.Load(), clk, limit) {
				if slow == nil || sc < slowS {
					slow, slowS, slowTrial = pr, sc, trial
				}
				continue
			}
			if best == nil || sc < bestS {
				best, bestS, bestTrial = pr, sc, trial
			}
		}
		if best == nil {
			best, bestTrial = slow, slowTrial
		}
		if best == nil || !bestTrial || best.trial.CompareAndSwap(false, true) {
			return best, bestTrial
		}
	}
	return nil, false
}

// takeable reports whether pr may take the call: not excluded, eligible
// (trial: it needs a trial call, not claimed here) and not stalled
// (stalled: skipped only for being stalled).
func takeable(pr *peer, ex *exclude, clk *pickClock, limit int64) (ok, trial, stalled bool) {
	if ex != nil && ex.has(pr) {
		return false, false, false
	}
	ok, trial = pr.eligible(clk)
	if !ok {
		return false, false, false
	}
	if pr.stalled(pr.inflight.Load(), clk, limit) || pr.remoteStall.Load() != 0 && pr.remoteStalled(clk) {
		return false, false, true
	}
	return true, trial, false
}

// rrTake returns pr when it may take the call, claiming its trial if it
// needs one; stalled reports a server skipped only for being stalled.
func rrTake(pr *peer, ex *exclude, clk *pickClock, limit int64) (_ *peer, trial, stalled bool) {
	ok, trial, stalled := takeable(pr, ex, clk, limit)
	if !ok || trial && !pr.trial.CompareAndSwap(false, true) {
		return nil, false, stalled
	}
	return pr, trial, false
}

// outcome updates a server's health after a call (or a check).
func (p *Pool) outcome(pr *peer, trial bool, err error) {
	if err == nil {
		if pr.fails.Load() != 0 {
			pr.resetRun()
		}
		if trial {
			p.back(pr)
		}
		return
	}
	if failureOf(err)&p.cfg.EjectOn == 0 {
		// Cancelled, closed, too large, or a failure the pool does not
		// eject on (health.on): no verdict on the server.
		if trial {
			pr.trial.Store(false) // no verdict
		}
		return
	}
	if trial {
		p.reeject(pr)
		return
	}
	pr.failCount.Add(1)
	if n := pr.fails.Add(1); int(n) >= p.cfg.Failures && pr.ejectedUntil.Load() == 0 {
		p.eject(pr)
	}
}

// resetRun ends the run of failures in a row: an answer came, or the
// server is back. Only a run that was on counts as a reset: the
// steady-state answer path stores nothing.
func (pr *peer) resetRun() {
	pr.fails.Store(0)
	pr.failAtReset.Store(pr.failCount.Load())
	pr.resets.Add(1)
}

// eject takes pr out of rotation, unless it is the last server that is
// not already down (a panic threshold: with one left, it keeps taking
// calls rather than none at all).
func (p *Pool) eject(pr *peer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr.ejectedUntil.Load() != 0 || pr.draining.Load() {
		return
	}
	others := 0
	for _, o := range p.set.Load().peers {
		if o != pr && o.ejectedUntil.Load() == 0 && o.c.up() {
			others++
		}
	}
	if others == 0 {
		return
	}
	d := time.Duration(pr.ejectFor.Load())
	pr.ejectedUntil.Store(monoNS(p.clk.Now().Add(d)))
	// fails is kept: peers() then shows the run of failures that caused
	// the ejection (and those still landing); back() resets it.
	pr.obs.Ejected()
	pr.refresh()
}

// reeject follows a failed trial: the next ejection is twice as long, up
// to 10× the configured one.
func (p *Pool) reeject(pr *peer) {
	d := min(2*time.Duration(pr.ejectFor.Load()), maxEjectFactor*p.cfg.Eject)
	pr.ejectFor.Store(int64(d))
	pr.ejectedUntil.Store(monoNS(p.clk.Now().Add(d)))
	pr.trial.Store(false)
	pr.obs.Ejected()
	p.log.Info("qrpc server still failing, ejected again", "addr", pr.addr, "for", d)
}

func (p *Pool) back(pr *peer) {
	pr.ejectFor.Store(int64(p.cfg.Eject))
	pr.ejectedUntil.Store(0)
	if pr.fails.Load() != 0 {
		pr.resetRun()
	}
	pr.trial.Store(false)
	pr.refresh()
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
