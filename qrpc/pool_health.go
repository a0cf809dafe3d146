package qrpc

import (
	"sync/atomic"
	"time"
)

// A server's health is one immutable value (health), replaced only by
// Pool.transition under Pool.hmu: every event that may change it (an
// answer, a failure, a check's result, a trial claimed or given back, a
// verdict of another view, a publication, DNS draining or removing the
// server) goes through next, one pure function. The call path reads the
// value with one atomic load and never writes it while nothing changes
// (an answer with no run of failures on and no trial costs a load).
//
// Two guards make a late event harmless:
//   - a trial call holds a token (trial): its outcome counts as the
//     trial's only while the token is the one held; the server back by
//     another way (a check, another view) drops the token, and the late
//     trial's failure is then an ordinary failure, under the ordinary
//     rules (the last server up is not ejected);
//   - a verdict of another view carries a generation (gen): a verdict no
//     newer than the one applied is refused, so a stale "back" never
//     undoes a fresher ejection.
type health struct {
	// gen is the generation of the shared verdict this state follows (0:
	// none): another view's verdict applies only when newer.
	gen uint64
	// until is the ejection's end (monoNS); 0: not ejected. It stays set
	// past that time until a trial call or a check answers.
	until int64
	// ejectFor is the length of the next ejection (ns).
	ejectFor int64
	// trial is the token of the trial call in flight (0: none).
	trial uint64
	// fails is the run of transport failures in a row (of every view
	// when shared).
	fails int32
	// remoteStall is when another view's stall verdict ends (monoNS; 0:
	// none).
	remoteStall int64

	// What a shared pool has to publish (pool_share.go): seq counts the
	// local changes of the verdict (an ejection, a return, a run ended);
	// pub is the seq last published. unshown is the failures counted
	// here and not yet added to the shared run of generation runGen.
	seq, pub uint64
	unshown  int32
	runGen   uint64
	// endRun: this view ended the shared run of runGen (an answer after
	// failures): the next step clears it. A run's end is no verdict: it
	// takes no new generation, so it can neither undo another view's
	// newer ejection nor leave keys behind per run.
	endRun bool

	draining, removed bool
}

func (h *health) ejected() bool { return h.until != 0 }

// dirty reports a local change of the verdict not published yet.
func (h *health) dirty() bool { return h.seq != h.pub }

type eventKind uint8

const (
	evAnswer      eventKind = iota + 1 // a call answered (any code); token: its trial
	evFailure                          // a transport failure that counts (health.on)
	evNoVerdict                        // an outcome that says nothing of the server; gives the trial back
	evCheckOK                          // the active check answered
	evClaim                            // a pick claims the trial of an ejection that is over
	evImport                           // another view's verdict (gen, eject, until, ejectFor)
	evPublished                        // this view's verdict went out under gen (seq: what it held)
	evRun                              // the shared run of runGen is n; reached: this view's failures brought it to health.failures
	evRunEnd                           // the shared run of gen is on and this view had an answer since: it ends
	evRunCleared                       // the shared run of gen was cleared (this view's end published)
	evRunGone                          // the shared run of gen is 0: another view ended it
	evRemoteStall                      // another view's stall verdict, until
	evDrain                            // DNS removed the server: it finishes its calls
	evUndrain                          // back in DNS before it drained
	evRemove                           // gone
	evLastUp                           // the servers up and not ejected left the pool: this ejected one is the last up
)

// event is one input of next.
type event struct {
	kind     eventKind
	token    uint64
	gen      uint64
	eject    bool
	until    int64 // monoNS
	ejectFor int64
	seq      uint64
	n        int32
	reached  bool
	now      int64 // monoNS
}

// policy is what next needs of the pool and of the other servers.
type policy struct {
	failures int32
	eject    int64 // the first ejection's length (ns)
	// othersUp: another server of the pool is up and not ejected (the
	// last one up is never ejected by policy: with none left it keeps
	// taking calls rather than none at all).
	othersUp bool
	newToken func() uint64
}

// effect tells the caller of next what to report.
type effect uint8

const (
	effEjected effect = 1 << iota
	effReejected
	effBack
	effRefused // a stale event: nothing changed
)

// next is the one transition of a server's health.
func next(h health, ev event, pol policy) (health, effect) {
	var eff effect
	switch ev.kind {
	case evAnswer:
		if ev.token != 0 && ev.token == h.trial {
			return back(h, pol), effBack
		}
		if ev.token != 0 && ev.token != h.trial {
			eff = effRefused // a stale trial: only its answer counts
		}
		if h.fails != 0 || h.unshown != 0 {
			h.fails, h.unshown = 0, 0
			h.endRun = true // a run ended: the other views hear of it
		}
	case evFailure:
		if ev.token != 0 && ev.token == h.trial {
			h.ejectFor = min(2*h.ejectFor, maxEjectFactor*pol.eject)
			h.until = ev.now + h.ejectFor
			h.trial = 0
			h.seq++
			return h, effReejected
		}
		if ev.token != 0 {
			eff = effRefused // the trial is stale: an ordinary failure
		}
		if h.fails < 1<<30 {
			h.fails++
			h.unshown++
		}
		if h.fails >= pol.failures && !h.ejected() && !h.draining && pol.othersUp {
			h.until = ev.now + h.ejectFor
			h.seq++
			eff |= effEjected
		}
	case evNoVerdict:
		if ev.token != 0 && ev.token == h.trial {
			h.trial = 0
		}
	case evCheckOK:
		if h.ejected() {
			return back(h, pol), effBack
		}
		if h.fails != 0 {
			h.fails, h.unshown = 0, 0
			h.endRun = true
		}
	case evClaim:
		if !h.ejected() || ev.now < h.until || h.trial != 0 || h.draining {
			return h, effRefused
		}
		h.trial = pol.newToken()
	case evImport:
		if ev.gen <= h.gen || h.dirty() {
			// Stale, or this view's own newer change is on its way out
			// (it gets a newer generation when published).
			return h, effRefused
		}
		was := h.ejected()
		h.gen, h.runGen = ev.gen, ev.gen
		h.fails, h.unshown = 0, 0
		switch {
		case ev.eject && ev.until > ev.now:
			h.ejectFor = min(max(ev.ejectFor, pol.eject), maxEjectFactor*pol.eject)
			until := min(ev.until, ev.now+h.ejectFor)
			if !was && (!pol.othersUp || h.draining) {
				break // the last server up stays up here
			}
			h.until = until
			if !was {
				eff = effEjected
			}
		case ev.eject:
			// An ejection over: a trial call or a check decides, as for
			// this view's own.
			h.ejectFor = min(max(ev.ejectFor, pol.eject), maxEjectFactor*pol.eject)
			if was {
				h.until = min(h.until, ev.now)
			}
		case was:
			h = back(h, pol)
			h.gen, h.runGen = ev.gen, ev.gen
			eff = effBack
		}
		// What another view published is no change of this one's: not
		// published again.
		h.pub = h.seq
		h.endRun = false
	case evPublished:
		if ev.gen > h.gen {
			h.gen = ev.gen
			h.runGen = ev.gen
		}
		if ev.seq == h.seq {
			h.pub = h.seq
		}
	case evRun:
		if ev.gen != h.runGen {
			return h, effRefused
		}
		h.unshown = max(0, h.unshown-ev.seq32())
		h.fails = max(h.fails, ev.n)
		if ev.reached && !h.ejected() && !h.draining && pol.othersUp {
			h.until = ev.now + h.ejectFor
			h.seq++
			eff = effEjected
		}
	case evRunEnd:
		if ev.gen != h.runGen || h.dirty() {
			return h, effRefused
		}
		h.fails, h.unshown = 0, 0
		h.endRun = true
	case evRunCleared:
		if ev.gen == h.runGen {
			h.endRun = false
		}
	case evRunGone:
		if ev.gen != h.runGen || h.unshown != 0 || h.fails == 0 {
			return h, effRefused
		}
		h.fails = 0
	case evRemoteStall:
		h.remoteStall = ev.until
	case evDrain:
		h.draining = true
		h.trial = 0
	case evUndrain:
		h.draining = false
	case evRemove:
		h.removed, h.draining = true, false
		h.trial = 0
	case evLastUp:
		// The ejection was allowed while another server was up; that
		// one has left the pool since, and the last server up is never
		// ejected by policy.
		if !h.ejected() || h.draining || pol.othersUp {
			return h, effRefused
		}
		// This view's exception, as an import's "the last server up
		// stays up here": not published (the others may have servers
		// up), and the next ejection goes on from this one's length.
		ejectFor := h.ejectFor
		h = back(h, pol)
		h.ejectFor = ejectFor
		h.pub = h.seq
		return h, effBack
	}
	return h, eff
}

// seq32 is the count an evRun event added (carried in seq).
func (ev *event) seq32() int32 { return int32(min(ev.seq, 1<<30)) }

// back ends an ejection: the server takes calls again.
func back(h health, pol policy) health {
	h.until = 0
	h.ejectFor = pol.eject
	h.trial = 0
	h.fails, h.unshown = 0, 0
	h.endRun = false
	h.seq++
	return h
}

// tokens numbers trial calls, process-wide (never 0).
var tokens atomic.Uint64

func newToken() uint64 { return tokens.Add(1) }

// transition applies ev to pr's health: the only writer of pr.h. It
// reports what changed to the observer and the log, and asks a shared
// pool to publish.
func (p *Pool) transition(pr *peer, ev event) (health, effect) {
	if ev.now == 0 {
		ev.now = monoNS(p.clk.Now())
	}
	p.hmu.Lock()
	old := pr.h.Load()
	pol := policy{failures: int32(p.cfg.Failures), eject: int64(p.cfg.Eject), newToken: newToken}
	if needsOthers(ev.kind) {
		pol.othersUp = p.othersUp(pr)
	}
	h, eff := next(*old, ev, pol)
	if h != *old {
		pr.h.Store(&h)
	}
	p.hmu.Unlock()
	if eff&(effEjected|effReejected) != 0 {
		pr.obs.Ejected()
	}
	if eff&effReejected != 0 {
		p.log.Info("qrpc server still failing, ejected again", "addr", pr.addr, "for", time.Duration(h.ejectFor))
	}
	if h.ejected() != old.ejected() || h.draining != old.draining || h.removed != old.removed {
		pr.refresh()
	}
	if h.dirty() && (!old.dirty() || h.seq != old.seq) || h.unshown > old.unshown || h.endRun && !old.endRun {
		p.shareChanged()
	}
	return h, eff
}

func needsOthers(k eventKind) bool {
	return k == evFailure || k == evImport || k == evRun || k == evLastUp
}

// othersUp reports whether a server of the pool other than pr is up and
// not ejected. Called with p.hmu held (so two ejections cannot both see
// the other up).
func (p *Pool) othersUp(pr *peer) bool {
	for _, o := range p.set.Load().peers {
		if o == pr {
			continue
		}
		if h := o.h.Load(); !h.ejected() && !h.draining && o.c.up() {
			return true
		}
	}
	return false
}
