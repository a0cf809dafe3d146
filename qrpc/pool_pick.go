package qrpc

import (
	"cmp"
	"math"
)

// admission is what admit says of a server for one call.
type admission uint8

const (
	admitNo    admission = iota // may not take it
	admitSoft                   // stalled (here or in another view): only when no other can
	admitYes                    // may take it
	admitTrial                  // ejected, its time up: may take it as the trial call, once claimed
)

// admit is the one rule of who may take a call: every balancer chooses
// only among the servers it admits. ex is the servers the call tried.
func (p *Pool) admit(pr *peer, ex *exclude, clk *pickClock) admission {
	if ex != nil && ex.n > 0 && ex.has(pr) {
		return admitNo
	}
	h := pr.h.Load()
	if h.draining || h.removed {
		return admitNo
	}
	if h.until != 0 {
		if h.trial != 0 || monoNS(clk.now()) < h.until || !pr.c.up() {
			return admitNo
		}
		return admitTrial
	}
	if !pr.c.up() {
		return admitNo
	}
	if pr.stalled(pr.inflight.Load(), clk, int64(p.cfg.Stall)) ||
		h.remoteStall != 0 && monoNS(clk.now()) < h.remoteStall {
		return admitSoft
	}
	return admitYes
}

// pick chooses the server for a call, or nil when none may take it; a
// token other than 0 is the trial call's, which the call gives back
// through its outcome. It takes no lock on the usual path: the set is an
// immutable snapshot, health one load per server. With one server in the
// pool it is always that one (its client's own error then says why it
// cannot take the call). relax lets a retry go back to a server in ex
// when no other can take it.
//
// Tiers are tried in order, first with the servers admitted outright,
// then, across every tier again, with the stalled ones: a stalled server
// of a first tier gives way to a second tier's healthy one.
func (p *Pool) pick(key []byte, ex *exclude, relax bool, clk *pickClock) (*peer, uint64) {
	if clk.src == nil {
		clk.src = p.clk
	}
	set := p.set.Load()
	if len(set.peers) == 0 {
		return nil, 0
	}
	if len(set.peers) == 1 {
		pr := set.peers[0]
		if ex != nil && ex.n > 0 && ex.has(pr) && !relax {
			return nil, 0
		}
		if p.admit(pr, nil, clk) == admitTrial {
			if tok := p.claim(pr, clk); tok != 0 {
				return pr, tok
			}
		}
		return pr, 0
	}
	for _, soft := range [2]bool{false, true} {
		for _, t := range set.tiers {
			if pr, tok := p.chooseIn(t, key, ex, clk, soft); pr != nil {
				return pr, tok
			}
		}
	}
	if relax && ex != nil && ex.n > 0 {
		for _, soft := range [2]bool{false, true} {
			for _, t := range set.tiers {
				if pr, tok := p.chooseIn(t, key, nil, clk, soft); pr != nil {
					return pr, tok
				}
			}
		}
	}
	return nil, 0
}

// claim takes pr's trial for this call (0: another call has it).
func (p *Pool) claim(pr *peer, clk *pickClock) uint64 {
	h, eff := p.transition(pr, event{kind: evClaim, now: monoNS(clk.now())})
	if eff&effRefused != 0 {
		return 0
	}
	return h.trial
}

// chooseIn lets the pool's balancer choose among t's admitted servers
// (soft: stalled ones too). A trial claimed by another call meanwhile
// makes it choose again, at most len(t.peers) times.
func (p *Pool) chooseIn(t *tier, key []byte, ex *exclude, clk *pickClock, soft bool) (*peer, uint64) {
	ok := func(pr *peer) admission {
		switch a := p.admit(pr, ex, clk); {
		case a == admitYes || a == admitTrial:
			return a
		case a == admitSoft && soft:
			return admitYes
		}
		return admitNo
	}
	for range len(t.peers) {
		pr, a := p.balance(t, key, ex, clk, ok)
		if pr == nil {
			return nil, 0
		}
		if a != admitTrial {
			return pr, 0
		}
		if tok := p.claim(pr, clk); tok != 0 {
			return pr, tok
		}
	}
	return nil, 0
}

// balance is the pool's balancer over one tier; ok is admit's verdict.
func (p *Pool) balance(t *tier, key []byte, ex *exclude, clk *pickClock, ok func(*peer) admission) (*peer, admission) {
	// A retry, a hedged copy or a call moving on from a server that
	// refused it takes turns of its own: taking the first attempts' turns
	// would hand the server after the one it avoids an extra share (with
	// a slow server hedged around, that is the slow one).
	rr := &p.rr
	if ex != nil && ex.n > 0 {
		rr = &p.rrExtra
	}
	n := uint32(len(t.peers))
	L := uint32(len(t.sched))
	switch {
	case p.cfg.Balance == P2C:
		now := monoNS(clk.now())
		cost := func(pr *peer) float64 { return pr.costW(now) }
		if n == 1 {
			pr := t.peers[0]
			if a := ok(pr); a != admitNo {
				return pr, a
			}
			return nil, admitNo
		}
		r := mix64(uint64(rr.Add(1)))
		var a, b *peer
		if t.weighted {
			a, b = t.peers[t.sched[uint32(r)%L]], t.peers[t.sched[uint32(r>>32)%L]]
		} else {
			i := uint32(r % uint64(n))
			a, b = t.peers[i], t.peers[(i+1+uint32((r>>32)%uint64(n-1)))%n]
		}
		ka, kb := ok(a), admitNo
		if b != a {
			kb = ok(b)
		}
		switch {
		case ka != admitNo && kb != admitNo:
			if cost(b) < cost(a) {
				return b, kb
			}
			return a, ka
		case ka != admitNo:
			return a, ka
		case kb != admitNo:
			return b, kb
		}
		return scanBest(t.peers, uint32(r%uint64(n)), ok, cost)
	case p.cfg.Balance == LeastInflight:
		return scanBest(t.peers, uint32(t.sched[rr.Add(1)%L]), ok, func(pr *peer) float64 {
			return float64(pr.inflight.Load()+1) / pr.share()
		})
	case p.cfg.Balance == Hash && len(key) > 0:
		kh := fnv64b(key)
		if !t.weighted {
			// rendezvous: the highest score wins (the lowest of its complement)
			return scanBest(t.peers, 0, ok, func(pr *peer) uint64 { return ^mix64(kh ^ pr.seed) })
		}
		// Weighted rendezvous hashing: of scores -ln(u)/w, u uniform in
		// (0, 1) from the key and the server, the lowest wins; a server
		// wins a share of the keys proportional to w.
		return scanBest(t.peers, 0, ok, func(pr *peer) float64 {
			u := (float64(mix64(kh^pr.seed)>>11) + 0.5) / (1 << 53)
			return -math.Log(u) / pr.share()
		})
	}
	// Round robin, in the tier's (weighted) order. Each probe takes a
	// turn of its own: a server that is skipped uses up its turns instead
	// of handing them to its neighbour, which would get twice its share.
	var i uint32
	for range n {
		i = rr.Add(1)
		pr := t.peers[t.sched[i%L]]
		if a := ok(pr); a != admitNo {
			return pr, a
		}
	}
	start := uint32(t.sched[i%L])
	for k := range n {
		pr := t.peers[(start+k)%n]
		if a := ok(pr); a != admitNo {
			return pr, a
		}
	}
	return nil, admitNo
}

// scanBest returns the admitted server with the lowest score, from
// peers[start] on (ties go to the first).
func scanBest[S cmp.Ordered](peers []*peer, start uint32, ok func(*peer) admission, score func(*peer) S) (*peer, admission) {
	n := uint32(len(peers))
	var best *peer
	var bestA admission
	var bestS S
	for i := range n {
		pr := peers[(start+i)%n]
		a := ok(pr)
		if a == admitNo {
			continue
		}
		if s := score(pr); best == nil || s < bestS {
			best, bestA, bestS = pr, a, s
		}
	}
	return best, bestA
}

// outcome updates a server's health after a call (or a check): token is
// the call's trial (0: none).
func (p *Pool) outcome(pr *peer, token uint64, err error) {
	switch {
	case err == nil:
		if h := pr.h.Load(); token == 0 && h.fails == 0 && h.unshown == 0 {
			return // the steady state writes nothing
		}
		p.transition(pr, event{kind: evAnswer, token: token})
	case failureOf(err)&p.cfg.EjectOn == 0:
		// Cancelled, closed, too large, or a failure the pool does not
		// eject on (health.on): no verdict on the server.
		if token != 0 {
			p.transition(pr, event{kind: evNoVerdict, token: token})
		}
	default:
		p.transition(pr, event{kind: evFailure, token: token})
	}
}

// giveBack returns a trial that was not used (the call was not sent, or
// was an event, which has no answer).
func (p *Pool) giveBack(pr *peer, token uint64) {
	if token != 0 {
		p.transition(pr, event{kind: evNoVerdict, token: token})
	}
}
