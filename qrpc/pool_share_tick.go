package qrpc

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// A shared pool's timer (shareTick) asks for the steps its leases need,
// so that an idle view wakes its process only when there is work:
//
//   - the view that holds a lease asks for a step when it is due for
//     renewal; its role's rounds (checkLoop, resolveLoop) run on their
//     own tickers, as in an unshared pool;
//   - a view that holds no lease sleeps until the lease it watches
//     lapses (the lease's record says when) or its holder's process
//     exits, then asks for a step to take it; its role loops wait for
//     that without a timer (roundDue).
//
// A step costs the host a wake-up of its thread and Go a few of its
// own, so a lease is renewed every leaseRenew, not every period, and
// lives leaseTTLFactor times that.

// shareMargin: a view watching another's lease steps this long after the
// lease's end, so that the key has gone from the store when it tries.
const shareMargin = 20 * time.Millisecond

// takeoverMargin: a dead holder's lease that ends sooner than this is not
// taken over but left to lapse (a step's rounds take microseconds; this
// covers a worker's thread descheduled between the read and the set).
const takeoverMargin = time.Second

// A lease is renewed every leaseRenewPeriods periods, at most every
// leaseRenewMax (and at least every period): each renewal is a step, and
// a step wakes the host's thread. A view whose holder's process exits
// takes the lease over at once (watchExit); one whose holder hangs, or
// gives the lease up while it lives on (a reload's old worker), when the
// lease lapses: within leaseTTLFactor renewal intervals.
const (
	leaseRenewPeriods = 16
	leaseRenewMax     = 30 * time.Second
)

// leaseRenew is the renewal interval of a pool of lease period period.
func leaseRenew(period time.Duration) time.Duration {
	return max(period, min(leaseRenewPeriods*period, leaseRenewMax))
}

// leaseValue is a lease's record: the holder's id and, after a space, when
// the lease ends (host monotonic ns).
func leaseValue(id string, endHost int64) []byte {
	return []byte(id + " " + strconv.FormatInt(endHost, 10))
}

// leaseParse splits a lease's record; end is 0 when it carries none.
func leaseParse(v []byte) (id string, endHost int64) {
	s := string(v)
	id, e, ok := strings.Cut(s, " ")
	if ok {
		endHost, _ = strconv.ParseInt(e, 10, 64)
	}
	return id, endHost
}

// roleInterval is the period of role l's rounds (0: p has none).
func (p *Pool) roleInterval(l int) time.Duration {
	switch {
	case l == leaseProbe && p.cfg.Check.Method != "" && p.cfg.Check.Interval > 0:
		return p.cfg.Check.Interval
	case l == leaseResolve && p.cfg.Resolve > 0 && p.hasNames():
		return p.cfg.Resolve
	}
	return 0
}

// roleKick is what role l's loop waits on while p is shared and another
// view holds the role (nil: p is not shared).
func (p *Pool) roleKick(l int) <-chan struct{} {
	s := &p.share
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sh == nil || !s.on.Load() {
		return nil
	}
	return s.sh.kick[l]
}

// kickLocked starts a round of role l now (the view has just won it).
// Called with share.mu held.
func (sh *sharer) kickLocked(l int) {
	select {
	case sh.kick[l] <- struct{}{}:
	default: // a round is asked already
	}
}

// shareArmLocked (re)arms the pool's timer for the next thing due. What
// is due now has had its step asked, and the step arms the timer again
// when it ends: the timer comes back a period later only in case the
// step never runs. Called with share.mu held.
func (p *Pool) shareArmLocked(sh *sharer, now int64) {
	if sh.period <= 0 || sh.exiting {
		return
	}
	next := int64(-1)
	soonest := func(at int64) {
		if next < 0 || at < next {
			next = at
		}
	}
	for l := range 2 {
		iv := int64(p.roleInterval(l))
		if iv == 0 {
			continue
		}
		if sh.holds[l] {
			soonest(sh.renewed[l] + int64(sh.renew))
		} else if sh.watch[l] > 0 {
			soonest(sh.watch[l] + int64(shareMargin))
		} else {
			soonest(now + int64(sh.period))
		}
		if !sh.holds[l] && now-sh.attached < int64(sh.renew) {
			// A view that has just come (a reload's new worker) looks
			// every period for a while: the view it replaces gives its
			// lease up at some point of that, not at the lease's end.
			soonest(now + int64(sh.period))
		}
	}
	if next < 0 {
		return
	}
	if next <= now {
		next = now + int64(sh.period)
	}
	d := time.Duration(next - now)
	if sh.tm == nil {
		sh.tm = p.clk.AfterFunc(d, safego.Func("pool share timer", p.shareTick, p.shareTickPanicked))
		return
	}
	sh.tm.Reset(d)
}

// shareTick asks for a step when a lease needs one, then arms the timer
// again.
func (p *Pool) shareTick() {
	if p.closed.Load() {
		return
	}
	s := &p.share
	s.mu.Lock()
	sh := s.sh
	if sh == nil || sh.exiting {
		s.mu.Unlock()
		return
	}
	now := monoNS(p.clk.Now())
	ask := false
	for l := range 2 {
		if p.roleInterval(l) == 0 {
			continue
		}
		if sh.holds[l] {
			ask = ask || now-sh.renewed[l] >= int64(sh.renew)*9/10
		} else {
			ask = ask || now >= sh.watch[l]
		}
	}
	p.shareArmLocked(sh, now)
	s.mu.Unlock()
	safego.Inject("pool share timer")
	if ask {
		p.shareChanged()
	}
}

// shareTickPanicked keeps the timer going after a panic in a tick.
func (p *Pool) shareTickPanicked() {
	if p.closed.Load() {
		return
	}
	s := &p.share
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh := s.sh; sh != nil && sh.tm != nil {
		sh.tm.Reset(sh.period)
	}
}

// watchHoldersLocked watches the processes of the views that hold the
// leases this view wants: when one exits (killed, crashed), this view
// steps at once and takes its lease over instead of waiting for the
// lease to lapse. Called with share.mu held.
func (p *Pool) watchHoldersLocked(sh *sharer) {
	for id, stop := range sh.watching {
		if id != sh.holder[0] && id != sh.holder[1] {
			if stop != nil {
				stop()
			}
			delete(sh.watching, id)
			delete(sh.dead, id)
		}
	}
	for _, id := range sh.holder {
		if id == "" || sh.dead[id] {
			continue
		}
		if _, ok := sh.watching[id]; ok || p.ctx != nil && p.ctx.Err() != nil {
			continue
		}
		pid, err := strconv.Atoi(id[:max(0, strings.IndexByte(id, '-'))])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			sh.watching[id] = nil // not a process this view can watch
			continue
		}
		stop, exited := watchExit(pid, func() { p.holderGone(id) })
		sh.watching[id] = stop
		if exited {
			sh.dead[id] = true
		}
	}
}

// holderGone: the process of the view id, which held a lease this view
// wants, has exited.
func (p *Pool) holderGone(id string) {
	s := &p.share
	s.mu.Lock()
	sh := s.sh
	if sh == nil || sh.exiting {
		s.mu.Unlock()
		return
	}
	if _, ok := sh.watching[id]; !ok {
		s.mu.Unlock()
		return
	}
	sh.dead[id] = true
	now := monoNS(p.clk.Now())
	for l := range 2 {
		if sh.holder[l] == id {
			sh.watch[l] = now
		}
	}
	p.shareArmLocked(sh, now)
	s.mu.Unlock()
	p.shareChanged()
}

// stopWatchersLocked ends every watch (the view goes away). Called with
// share.mu held.
func (sh *sharer) stopWatchersLocked() {
	for id, stop := range sh.watching {
		if stop != nil {
			stop()
		}
		delete(sh.watching, id)
	}
}

// ShareNext hands out the first round of this view's next step, for the
// host to run when that step begins and to give with it (ShareStep): an
// idle step then takes one exchange with Go instead of two (each wakes
// Go's threads). Called after a step's last exchange; nil: none.
func (p *Pool) ShareNext() []StoreOp {
	s := &p.share
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.sh
	if sh == nil || sh.exiting || sh.step != nil {
		return nil
	}
	sh.step = &shareRun{}
	ops := p.shareRead(sh, p.clk.Now())
	sh.pre, sh.step = sh.step, nil
	return ops
}
