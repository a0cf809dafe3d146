package qrpc

import (
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// A pool can be one of several views of the same servers: each nginx
// worker holds its own pool, and the Lua side may share the verdicts
// between them (a lua_shared_dict). The pool then takes its peers' health
// from outside (Import), lets one of the views probe and resolve (SetRoles)
// and takes the address list that view resolved (ImportResolved). The
// balancing stays the pool's own.

// Verdict is one server's health as the pools sharing it last agreed.
type Verdict struct {
	Addr string
	// Ejected: the server is out of rotation for EjectFor more (0: its
	// ejection is over, and a trial call or a check decides).
	Ejected  bool
	EjectFor time.Duration
	// Stalled: another view sees calls in flight and no answer; this
	// pool skips the server softly (as its own stall verdict does) for
	// remoteStallHold, unless told again.
	Stalled bool
	// Keep: the ejection is not known (only Stalled is); leave it.
	Keep bool

	// The run of transport failures in a row (health.failures), counted
	// over every view. Import: with HasRun, Run is the shared run; the
	// pool's own run becomes Run plus the failures it counted since View
	// last reported them (so that the next one of its own, or an
	// answer's reset, counts from the instance's run). Reached: the
	// shared run reached health.failures with this view's own failures:
	// the pool ejects the server as its own failures would have (unless
	// it already is ejected, or the panic threshold keeps it).
	HasRun  bool
	Run     int
	Reached bool
	// View: Counted is the failures this view counted towards its run
	// (ever, wrapping), Resets the runs it ended (an answer after
	// failures, or the server back; wrapping), SinceReset the failures
	// it counted since the last of them.
	Counted, Resets, SinceReset uint32
}

// remoteStallHold is how long another view's stall verdict holds here
// without being told again. The view that saw the stall repeats it while
// it lasts; when that view stops calling (and so stops repeating), the
// verdict lapses rather than keeping a server out forever.
const remoteStallHold = time.Second

// Resolved is one address of the list the resolving view found.
type Resolved struct {
	Addr     string
	Name     string // TLS server name ("" : the address's host)
	Priority uint16
	Weight   uint16
}

// shareState is the part of Pool that sharing adds.
type shareState struct {
	noProbe   atomic.Bool // another view probes
	noResolve atomic.Bool // another view resolves
	// resolvedGen counts the address lists this pool resolved itself (or
	// dialled with); resolved is the last one, under Pool.mu.
	resolvedGen atomic.Uint64
	resolved    []Resolved
}

// SetRoles says whether this view runs the active checks and the
// re-resolution. A pool starts with both; the others' views turn them off.
func (p *Pool) SetRoles(probe, resolve bool) {
	p.share.noProbe.Store(!probe)
	p.share.noResolve.Store(!resolve)
}

// Import applies the verdicts other views reached. An ejection is kept
// to the same rule as the pool's own (never the last server not already
// down) and is not counted as an ejection of this view; a server no
// longer ejected elsewhere comes back here too.
func (p *Pool) Import(vs []Verdict) {
	now := p.clk.Now()
	for _, v := range vs {
		p.mu.Lock()
		pr := p.peers[v.Addr]
		p.mu.Unlock()
		if pr == nil {
			continue
		}
		if v.Stalled {
			pr.remoteStall.Store(monoNS(now.Add(remoteStallHold)))
		} else {
			pr.remoteStall.Store(0)
		}
		switch {
		case v.Keep:
		case v.Ejected && pr.ejectedUntil.Load() == 0:
			p.importEject(pr, monoNS(now.Add(v.EjectFor)))
		case v.Ejected:
			if u := monoNS(now.Add(v.EjectFor)); u > pr.ejectedUntil.Load() {
				pr.ejectedUntil.Store(u)
			}
		case pr.ejectedUntil.Load() != 0:
			p.back(pr)
		}
		if v.HasRun {
			// the failures counted here that the shared run does not
			// have yet (View reports them at the end of this exchange)
			pend := int64(int32(pr.failCount.Load() - pr.failShown.Load()))
			n := min(int64(max(v.Run, 0))+max(pend, 0), math.MaxInt32)
			pr.fails.Store(int32(n))
			if v.Reached && int(n) >= p.cfg.Failures && pr.ejectedUntil.Load() == 0 {
				p.eject(pr)
			}
		}
	}
}

func (p *Pool) importEject(pr *peer, until int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr.ejectedUntil.Load() != 0 || pr.draining.Load() {
		return
	}
	for _, o := range p.set.Load().peers {
		if o != pr && o.ejectedUntil.Load() == 0 && o.c.up() {
			pr.ejectedUntil.Store(until)
			pr.refresh()
			return
		}
	}
}

// remoteStalled reports whether another view's stall verdict on pr holds.
func (pr *peer) remoteStalled(clk *pickClock) bool {
	u := pr.remoteStall.Load()
	return u != 0 && monoNS(clk.now()) < u
}

// ShareView is what this view has to tell the others: each server's own
// verdict (not the imported ones' echo: Stalled is this view's stall
// verdict only), the run of failures it counted, and the address list
// it last resolved.
type ShareView struct {
	Peers       []Verdict // sorted by address; Ejected with EjectFor 0 once over
	ResolvedGen uint64
	Resolved    []Resolved
	// Requests and Accepts are this view's adaptive throttling window
	// (0 without throttling).
	Requests, Accepts int64
}

// SetOthersThrottle gives adaptive throttling the other views' window
// (their requests and accepts over the last two minutes): the pool then
// sheds on the sum, as one pool would. No-op without throttling.
func (p *Pool) SetOthersThrottle(requests, accepts int64) {
	if th := p.throttle; th != nil {
		th.otherReqs.Store(max(0, requests))
		th.otherAccs.Store(max(0, accepts))
	}
}

// View reports this pool's verdicts, and its resolved list when its
// generation differs from seenGen.
func (p *Pool) View(seenGen uint64) ShareView {
	now := p.clk.Now()
	clk := pickClock{t: now, src: p.clk}
	var out ShareView
	p.mu.Lock()
	for _, pr := range p.peers {
		v := Verdict{Addr: pr.addr}
		if u := pr.ejectedUntil.Load(); u != 0 {
			v.Ejected = true
			v.EjectFor = max(0, time.Duration(u-monoNS(now)))
		}
		v.Stalled = pr.stalled(pr.inflight.Load(), &clk, int64(p.cfg.Stall))
		v.Resets = pr.resets.Load()
		v.Counted = pr.failCount.Load()
		v.SinceReset = v.Counted - pr.failAtReset.Load()
		pr.failShown.Store(v.Counted)
		out.Peers = append(out.Peers, v)
	}
	if th := p.throttle; th != nil {
		out.Requests, out.Accepts = th.counts(now)
	}
	out.ResolvedGen = p.share.resolvedGen.Load()
	if out.ResolvedGen != seenGen {
		out.Resolved = slices.Clone(p.share.resolved)
	}
	p.mu.Unlock()
	slices.SortFunc(out.Peers, func(a, b Verdict) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// noteResolved keeps the list this view resolved, for View. Called with
// p.mu held.
func (p *Pool) noteResolved(want []string, names map[string]string, meta map[string]srvMeta) {
	list := make([]Resolved, 0, len(want))
	for _, a := range want {
		m := meta[a]
		list = append(list, Resolved{Addr: a, Name: names[a], Priority: m.prio, Weight: max(m.weight, 1)})
	}
	if slices.Equal(list, p.share.resolved) && p.share.resolvedGen.Load() != 0 {
		return
	}
	p.share.resolved = list
	p.share.resolvedGen.Add(1)
}

// ImportResolved makes list the pool's servers, as its own re-resolution
// would (new ones join, missing ones drain). It does nothing on a pool
// without names to resolve, or on an empty list.
func (p *Pool) ImportResolved(list []Resolved) error {
	if len(list) == 0 || !p.hasNames() {
		return nil
	}
	want := make([]string, 0, len(list))
	names := map[string]string{}
	meta := map[string]srvMeta{}
	for _, r := range list {
		want = append(want, r.Addr)
		if r.Name != "" {
			names[r.Addr] = r.Name
		}
		meta[r.Addr] = srvMeta{prio: r.Priority, weight: max(r.Weight, 1)}
	}
	slices.Sort(want)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return ErrClosed
	}
	return p.apply(want, names, meta)
}
