package qrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// Start sends a call to a server that is up, as Client.Start does. A call
// that cannot be sent to the server picked goes to another one; a call
// that failed in transport after it may have run is retried on another
// server only with retries (Call.Retries or PoolConfig.Retries), within the
// call's deadline and the pool's retry budget. With a try timeout each
// attempt has its own bound; with hedging, copies go to other servers
// while the call is unanswered. done is called once, with the first answer
// or the last attempt's error.
func (p *Pool) Start(call *Call, done Done) (Pending, error) {
	return p.start(call, done, nil)
}

// DoneAttempts is Done with the number of attempts the call made: the
// first, its retries and the hedged copies it sent (1 for a call answered
// by its first attempt alone).
type DoneAttempts func(resp *Response, attempts int, err error)

// StartAttempts is Start for a caller that reports how many attempts a
// call took, whatever its outcome.
func (p *Pool) StartAttempts(call *Call, done DoneAttempts) (Pending, error) {
	return p.start(call, nil, done)
}

// start is Start and StartAttempts: exactly one of done and doneN is set.
func (p *Pool) start(call *Call, done Done, doneN DoneAttempts) (Pending, error) {
	if p.closed.Load() {
		return Pending{}, ErrClosed
	}
	retries := p.cfg.Retries
	if call.Retries != 0 {
		retries = min(max(call.Retries, 0), MaxRetries)
	}
	try := p.cfg.TryTimeout
	if call.TryTimeout != 0 {
		try = max(call.TryTimeout, 0)
	}
	hedge := p.cfg.Hedge
	if call.Hedge.Max != 0 {
		hedge = call.Hedge
		hedge.Max = min(max(hedge.Max, 0), MaxHedge)
	}
	now := p.clk.Now()
	if p.throttle != nil && !p.throttle.admit(now) {
		if o, ok := p.cfg.Observer.(ThrottleObserver); ok {
			o.Throttled(call.Method)
		}
		return Pending{}, ErrThrottled
	}
	p.budget.deposit(now)
	pc := &poolCall{pool: p, done: done, doneN: doneN, retries: retries, try: try, deadline: call.Deadline}
	if p.observed {
		// The observer hears of the call after Start returns, when the
		// caller's slice may be reused; without one, no copy to make.
		pc.method = append([]byte(nil), call.Method...)
	}
	if retries > 0 || hedge.Max > 0 {
		// Later attempts outlive the caller's slices.
		pc.call = cloneCall(call)
		pc.key = pc.call.HashKey
	} else {
		pc.key = call.HashKey
	}
	pc.mu.Lock()
	err := pc.attempt(call, false, now)
	pc.key = pc.call.HashKey // nil unless cloned: the caller's may be reused
	if err == nil && hedge.Max > 0 {
		pc.armHedge(hedge)
	}
	pc.mu.Unlock()
	if err != nil {
		if p.throttle != nil {
			p.throttle.record(now, nil, err)
		}
		return Pending{}, err
	}
	return Pending{pc: pc}, nil
}

func cloneCall(c *Call) Call {
	out := Call{
		Method:     append([]byte(nil), c.Method...),
		Body:       append([]byte(nil), c.Body...),
		HashKey:    append([]byte(nil), c.HashKey...),
		Deadline:   c.Deadline,
		Retries:    c.Retries,
		TryTimeout: c.TryTimeout,
		Hedge:      c.Hedge,
	}
	if len(c.Headers) > 0 {
		out.Headers = make([][]byte, len(c.Headers))
		for i, h := range c.Headers {
			out.Headers[i] = append([]byte(nil), h...)
		}
	}
	return out
}

// attemptRec is one attempt of a call, in flight.
type attemptRec struct {
	pend  Pending
	peer  *peer
	trial uint64 // the trial's token (0: not a trial)
	began time.Time
	seq   uint32
}

// poolCall is one call through a pool, across its attempts: the first,
// its retries (one after another) and its hedged copies (side by side).
type poolCall struct {
	pool     *Pool
	done     Done // or doneN: see finish
	doneN    DoneAttempts
	method   []byte // copied, for the observer
	key      []byte
	deadline time.Time
	try      time.Duration
	call     Call // a copy, kept only when a second attempt may run
	ex       exclude

	mu        sync.Mutex
	retries   int
	hedge     Hedge
	hedges    int   // copies left to send
	timer     timer // the next copy; stopped when the call ends
	live      [1 + MaxHedge]attemptRec
	nlive     int
	attempts  int
	seq       uint32
	lastErr   error
	cancelled bool
	finished  bool
}

// attempt starts the call on a server, moving on to others while the
// call cannot be sent. Called with pc.mu held; now is the time of the
// pick (the caller has read it).
func (pc *poolCall) attempt(call *Call, retry bool, now time.Time) error {
	p := pc.pool
	var lastErr error
	// Each server at most once per pass (those that refuse join pc.ex):
	// the loop ends whatever the servers answer.
	for range len(p.set.Load().peers) + 1 {
		clk := pickClock{t: now, src: p.clk}
		pr, trial := p.pick(pc.key, &pc.ex, retry, &clk)
		if pr == nil {
			return p.refused(lastErr)
		}
		began := clk.t
		pr.startCall(began)
		pc.seq++
		seq := pc.seq
		c := call
		if pc.try > 0 {
			if end := began.Add(pc.try); pc.deadline.IsZero() || end.Before(pc.deadline) {
				// Client.Start reads the call and keeps none of it: a copy
				// on the stack carries this attempt's own deadline.
				cc := *call
				cc.Deadline = end
				c = &cc
			}
		}
		pend, err := pr.c.Start(c, func(resp *Response, err error) {
			pc.attemptDone(seq, pr, trial, began, resp, err)
		})
		if err == nil {
			pc.live[pc.nlive] = attemptRec{pend: pend, peer: pr, trial: trial, began: began, seq: seq}
			pc.nlive++
			pc.attempts++
			return nil
		}
		pr.endCall()
		// The attempt chose this server, which refused it at once (its
		// connection down, its queue full): that is the attempt's result,
		// counted like one that failed later. No health verdict: nothing
		// reached the server.
		pr.obs.CallDone(pc.method, 0, err, p.clk.Now().Sub(began))
		p.giveBack(pr, trial)
		if !neverSent(err) {
			return err
		}
		pc.ex.add(pr)
		lastErr = err
		// A retry may go back to a server it tried (when no other can take
		// it), but not to one that just refused it: that would loop.
		retry = false
		now = p.clk.Now()
	}
	return p.refused(lastErr)
}

// take removes the live attempt seq; false when it is not live (a copy
// that lost, cancelled by the winner).
func (pc *poolCall) take(seq uint32) bool {
	for i := 0; i < pc.nlive; i++ {
		if pc.live[i].seq == seq {
			pc.nlive--
			pc.live[i] = pc.live[pc.nlive]
			pc.live[pc.nlive] = attemptRec{}
			return true
		}
	}
	return false
}

// failurePenalty is the answer time a failed attempt counts for in the
// peak EWMA (p2c's cost, the stall limit): as slow as a slow answer.
const failurePenalty = time.Second

// account ends an attempt: counters, observer, the server's health.
func (pc *poolCall) account(pr *peer, trial uint64, began time.Time, resp *Response, err error) {
	now := pc.pool.clk.Now()
	if err == nil {
		pr.answered(now, now.Sub(began))
	} else if f := failureOf(err); f == FailTimeout {
		// A timed-out attempt is a latency sample too: p2c and the stall
		// limit must see that the server is slow.
		pr.observeLatency(monoNS(now), now.Sub(began))
	} else if f != 0 {
		// A transport failure that came fast is no fast answer: p2c would
		// send a server that fails every call at once nearly all of them
		// (its cost stays 0). It weighs as an answer of failurePenalty.
		pr.observeLatency(monoNS(now), max(now.Sub(began), failurePenalty))
	}
	pr.endCall()
	if err == nil || !errors.Is(err, context.Canceled) {
		// A cancelled attempt (a copy that lost to another's answer, a
		// call its caller gave up on before its deadline) has no outcome
		// anyone saw: it is no call result for the metrics.
		var code uint32
		if resp != nil {
			code = resp.Code
		}
		pr.obs.CallDone(pc.method, code, err, now.Sub(began))
	}
	pc.pool.outcome(pr, trial, err)
}

func (pc *poolCall) attemptDone(seq uint32, pr *peer, trial uint64, began time.Time, resp *Response, err error) {
	pc.account(pr, trial, began, resp, err)
	p := pc.pool
	pc.mu.Lock()
	if !pc.take(seq) || pc.finished || pc.cancelled {
		pc.mu.Unlock()
		return
	}
	if err == nil {
		// An answer, whatever its code: the first one wins.
		losers := pc.end()
		attempts := pc.attempts
		pc.mu.Unlock()
		pc.finish(resp, attempts, nil)
		pc.cancelAll(losers, nil)
		return
	}
	pc.lastErr = err
	if pc.nlive > 0 {
		pc.mu.Unlock() // a copy may still answer
		return
	}
	budget := false
	if now := p.clk.Now(); pc.retries > 0 && transportFailure(err) &&
		(pc.deadline.IsZero() || now.Before(pc.deadline)) && !p.closed.Load() {
		if p.budget.withdraw(now) {
			pc.retries--
			pc.ex.add(pr)
			pr.obs.Retried(err)
			if pc.attempt(&pc.call, true, now) == nil {
				pc.mu.Unlock()
				return
			}
			// No server took the retry: what it withdrew goes back.
			p.budget.refund(now)
		} else {
			budget = true
			pr.obs.BudgetExhausted()
		}
	}
	pc.end()
	attempts := pc.attempts
	pc.mu.Unlock()
	pc.finish(resp, attempts, attemptsError(err, attempts, budget, pr.addr))
}

// finish delivers the call's outcome to its caller, once.
func (pc *poolCall) finish(resp *Response, attempts int, err error) {
	if th := pc.pool.throttle; th != nil {
		th.record(pc.pool.clk.Now(), resp, err)
		pc.pool.shareSoon() // the window, for the other views
	}
	if pc.doneN != nil {
		pc.doneN(resp, attempts, err)
		return
	}
	pc.done(resp, err)
}

// end marks the call finished and stops its hedge timer; it returns the
// attempts still live, for the caller to cancel once pc.mu is released.
// Called with pc.mu held.
func (pc *poolCall) end() [1 + MaxHedge]attemptRec {
	pc.finished = true
	if pc.timer != nil {
		pc.timer.Stop()
	}
	live := pc.live
	pc.live = [1 + MaxHedge]attemptRec{}
	pc.nlive = 0
	return live
}

// cancelAll cancels attempts taken off a call. An attempt that was still
// pending ends here, with err (nil: it lost to another answer, which is
// no verdict on its server).
func (pc *poolCall) cancelAll(live [1 + MaxHedge]attemptRec, err error) {
	for i := range live {
		a := &live[i]
		if a.peer == nil || !a.pend.Cancel() {
			continue
		}
		e := err
		if e == nil {
			e = errHedgeLost
		}
		pc.account(a.peer, a.trial, a.began, nil, e)
	}
}

// errHedgeLost ends a copy whose call another copy answered: no verdict
// on its server, and no call result in the metrics (account).
var errHedgeLost = fmt.Errorf("%w: another copy answered first", context.Canceled)

func (pc *poolCall) cancel() bool {
	pc.mu.Lock()
	if pc.finished || pc.cancelled {
		pc.mu.Unlock()
		return false
	}
	// From here no attempt delivers: one whose done is already running
	// finds the call cancelled (and only counts its outcome), the others
	// are cancelled below.
	pc.cancelled = true
	live := pc.end()
	pc.mu.Unlock()
	// A caller that gives up at the call's deadline (Unary's context
	// usually beats the client's own timer) saw a timeout: the server's
	// health must count it as one.
	var err error = context.Canceled
	if now := pc.pool.clk.Now(); !pc.deadline.IsZero() && !now.Before(pc.deadline) {
		err = fmt.Errorf("%w: no response within the deadline", ErrTimeout)
		if th := pc.pool.throttle; th != nil {
			th.record(now, nil, err) // the caller's timeout: finish never runs
		}
	}
	pc.cancelAll(live, err)
	return true
}

// armHedge starts the timer of the next copy. Called with pc.mu held.
func (pc *poolCall) armHedge(h Hedge) {
	d := h.Delay
	if h.P95 {
		d = pc.pool.lat.p95()
		if d <= 0 {
			return // not measured yet: no copies
		}
		d = max(d, time.Millisecond)
	}
	pc.hedge, pc.hedges = h, h.Max
	pc.timer = pc.pool.clk.AfterFunc(d, safego.Func("pool hedge timer", pc.hedgeFire, nil))
}

// hedgeFire sends the next copy of a call still unanswered, to a server
// that has none of its copies.
func (pc *poolCall) hedgeFire() {
	p := pc.pool
	pc.mu.Lock()
	defer pc.mu.Unlock()
	safego.Inject("pool hedge timer")
	if pc.finished || pc.cancelled || pc.hedges <= 0 || pc.nlive == 0 || p.closed.Load() {
		return
	}
	now := p.clk.Now()
	if !pc.deadline.IsZero() && !now.Before(pc.deadline) {
		return
	}
	first := pc.live[0].peer
	if !p.budget.withdraw(now) {
		first.obs.BudgetExhausted()
		return
	}
	for i := 0; i < pc.nlive; i++ {
		pc.ex.add(pc.live[i].peer)
	}
	if pc.attempt(&pc.call, false, now) != nil {
		// No other server can take a copy now; the budget spent on it is
		// returned.
		p.budget.refund(now)
		return
	}
	first.obs.Hedged()
	pc.hedges--
	if pc.hedges > 0 {
		pc.timer.Reset(pc.hedge.Delay)
		if pc.hedge.P95 {
			pc.timer.Reset(max(p.lat.p95(), time.Millisecond))
		}
	}
}

// AttemptsError is the error of a call that made more than one attempt,
// or whose retry the budget refused: the last attempt's error (errors.Is
// and errors.As see it), with the count.
type AttemptsError struct {
	Err      error
	Attempts int
	// Budget: a retry was refused by the pool's retry budget.
	Budget bool
	// Server is the address of the server of the last attempt.
	Server string
}

func attemptsError(err error, attempts int, budget bool, server string) error {
	if attempts <= 1 && !budget {
		return err
	}
	return &AttemptsError{Err: err, Attempts: attempts, Budget: budget, Server: server}
}

func (e *AttemptsError) Error() string {
	return e.Err.Error() + e.Suffix()
}

// Suffix is what the error adds to the last attempt's: " (2 attempts)",
// " (1 attempt, retry budget exhausted)".
func (e *AttemptsError) Suffix() string {
	s := "s"
	if e.Attempts == 1 {
		s = ""
	}
	if e.Budget {
		return fmt.Sprintf(" (%d attempt%s, retry budget exhausted)", e.Attempts, s)
	}
	return fmt.Sprintf(" (%d attempt%s)", e.Attempts, s)
}

func (e *AttemptsError) Unwrap() error { return e.Err }
