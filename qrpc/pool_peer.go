package qrpc

import (
	"sync/atomic"
	"time"
)

// peer is one server of a pool: its client, its health and its counters.
// Everything the call path reads is atomic.
type peer struct {
	pool *Pool
	addr string
	c    *Client
	obs  PeerObserver
	seed uint64 // rendezvous hashing weight seed, from addr

	inflight atomic.Int64
	calls    atomic.Uint64
	fails    atomic.Int32 // transport failures in a row

	// ejectedUntil is the end of the ejection in Unix nanoseconds, 0 when
	// not ejected; it stays set past that time until a trial call (one at
	// a time: trial) or an active check answers. ejectFor is the length of
	// the next ejection.
	ejectedUntil atomic.Int64
	ejectFor     atomic.Int64
	trial        atomic.Bool

	draining atomic.Bool
	removed  atomic.Bool
	state    atomic.Uint32 // last PeerState reported
}

func newPeer(p *Pool, addr string) *peer {
	pr := &peer{pool: p, addr: addr, seed: mix64(fnv64(addr))}
	pr.ejectFor.Store(int64(p.cfg.Eject))
	pr.obs = p.cfg.Observer.Peer(addr)
	pr.state.Store(uint32(PeerConnecting))
	pr.obs.StateChanged(PeerConnecting)
	return pr
}

func (pr *peer) startCall() {
	pr.inflight.Add(1)
	pr.calls.Add(1)
	pr.obs.InflightAdd(1)
}

func (pr *peer) endCall() {
	pr.inflight.Add(-1)
	pr.obs.InflightAdd(-1)
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
				"for", time.Duration(pr.ejectFor.Load()), "until", time.Unix(0, pr.ejectedUntil.Load()).Format(time.RFC3339Nano))
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
	}
	if u := pr.ejectedUntil.Load(); u != 0 {
		in.EjectedUntil = time.Unix(0, u)
	}
	return in
}

// eligible reports whether pr may take a call. An ejected server whose
// time is up may take one trial call (needTrial); the caller claims it.
func (pr *peer) eligible(now *int64) (ok, needTrial bool) {
	if until := pr.ejectedUntil.Load(); until != 0 {
		if *now == 0 {
			*now = time.Now().UnixNano()
		}
		if *now < until || pr.trial.Load() {
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
func (p *Pool) pick(key []byte, ex *exclude, relax bool) (*peer, bool) {
	peers := p.set.Load().peers
	n := len(peers)
	if n == 0 {
		return nil, false
	}
	if n == 1 {
		pr := peers[0]
		if ex != nil && ex.has(pr) && !relax {
			return nil, false
		}
		var now int64
		if ok, trial := pr.eligible(&now); ok && trial {
			if pr.trial.CompareAndSwap(false, true) {
				return pr, true
			}
		}
		return pr, false
	}
	pr, trial := p.choose(peers, key, ex)
	if pr == nil && relax && ex != nil && ex.n > 0 {
		pr, trial = p.choose(peers, key, nil)
	}
	return pr, trial
}

func (p *Pool) choose(peers []*peer, key []byte, ex *exclude) (*peer, bool) {
	var now int64
	n := uint32(len(peers))
	switch {
	case p.cfg.Balance == LeastInflight:
		start := p.rr.Add(1)
		// A claimed trial may fail (another call took it): then look again,
		// at most n times.
		for range n {
			var best *peer
			var bestTrial bool
			var bestN int64
			for i := uint32(0); i < n; i++ {
				pr := peers[(start+i)%n]
				if ex != nil && ex.has(pr) {
					continue
				}
				ok, trial := pr.eligible(&now)
				if !ok {
					continue
				}
				if in := pr.inflight.Load(); best == nil || in < bestN {
					best, bestN, bestTrial = pr, in, trial
				}
			}
			if best == nil || !bestTrial || best.trial.CompareAndSwap(false, true) {
				return best, bestTrial
			}
		}
		return nil, false
	case p.cfg.Balance == Hash && len(key) > 0:
		kh := fnv64b(key)
		for range n {
			var best *peer
			var bestTrial bool
			var bestScore uint64
			for _, pr := range peers {
				if ex != nil && ex.has(pr) {
					continue
				}
				ok, trial := pr.eligible(&now)
				if !ok {
					continue
				}
				if s := mix64(kh ^ pr.seed); best == nil || s > bestScore {
					best, bestScore, bestTrial = pr, s, trial
				}
			}
			if best == nil || !bestTrial || best.trial.CompareAndSwap(false, true) {
				return best, bestTrial
			}
		}
		return nil, false
	}
	// Each probe takes a turn of its own: a server that is skipped uses up
	// its turns instead of handing them to its neighbour, which would get
	// twice its share.
	var i uint32
	for range n {
		i = p.rr.Add(1)
		if pr, trial := rrTake(peers[i%n], ex, &now); pr != nil {
			return pr, trial
		}
	}
	for k := uint32(1); k < n; k++ {
		if pr, trial := rrTake(peers[(i+k)%n], ex, &now); pr != nil {
			return pr, trial
		}
	}
	return nil, false
}

func rrTake(pr *peer, ex *exclude, now *int64) (*peer, bool) {
	if ex != nil && ex.has(pr) {
		return nil, false
	}
	ok, trial := pr.eligible(now)
	if !ok || (trial && !pr.trial.CompareAndSwap(false, true)) {
		return nil, false
	}
	return pr, trial
}

// outcome updates a server's health after a call (or a check).
func (p *Pool) outcome(pr *peer, trial bool, err error) {
	if err == nil {
		pr.fails.Store(0)
		if trial {
			p.back(pr)
		}
		return
	}
	if !transportFailure(err) {
		// Cancelled, closed, too large: no verdict on the server.
		if trial {
			pr.trial.Store(false) // no verdict
		}
		return
	}
	if trial {
		p.reeject(pr)
		return
	}
	if n := pr.fails.Add(1); int(n) >= p.cfg.Failures && pr.ejectedUntil.Load() == 0 {
		p.eject(pr)
	}
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
	pr.ejectedUntil.Store(time.Now().Add(d).UnixNano())
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
	pr.ejectedUntil.Store(time.Now().Add(d).UnixNano())
	pr.trial.Store(false)
	pr.obs.Ejected()
	p.log.Info("qrpc server still failing, ejected again", "addr", pr.addr, "for", d)
}

func (p *Pool) back(pr *peer) {
	pr.ejectFor.Store(int64(p.cfg.Eject))
	pr.ejectedUntil.Store(0)
	pr.fails.Store(0)
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
