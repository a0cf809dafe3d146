package qrpc

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// A pool can be one of several views of the same servers: each nginx
// worker holds its own pool, and the workers share what they learn of
// the servers through a store (a lua_shared_dict) that only the host can
// reach. All the logic of sharing is here: the host runs the store
// operations a step asks for and hands back their results (ShareStep),
// without reading what it moves. The simulation (poolsim_test.go) runs
// the same steps against a store of its own.
//
// The keys a pool's steps use are listed in pool_share_keys.go.

// Store operations of a step.
const (
	OpGet    = 1 // key -> value or nil
	OpAdd    = 2 // key, value, ttl -> true when the key was absent
	OpSet    = 3 // key, value, ttl
	OpIncr   = 4 // key, delta, init, ttl (also refreshes the TTL) -> the new value
	OpDelete = 5 // key
)

// StoreOp is one operation a step asks the host to run.
type StoreOp struct {
	Kind  uint8
	Key   string // under the pool's prefix
	Value []byte // OpAdd, OpSet
	Delta int64  // OpIncr
	Init  int64  // OpIncr: the value of an absent key before the delta
	TTL   time.Duration
}

// StoreResult is an operation's result: Value for OpGet (nil: absent),
// OK for OpAdd, N for OpIncr (OK false: failed).
type StoreResult struct {
	OK    bool
	Value []byte
	N     int64
}

// Step modes.
const (
	ShareStep = 1 // read the others' verdicts, publish this view's
	ShareExit = 2 // give up the leases: the view goes away
	// ShareAsync, or'd into a mode (or alone: go on), marks an exchange
	// that came through the host's queue, not a call on its thread. A
	// step runs through one or the other; an exchange of the other kind
	// than the step's is refused (nil, false) and leaves the step be.
	ShareAsync = 16
)

const (
	// shareStallTTL: another view's stall verdict holds this long unless
	// repeated; the view that sees it repeats it every shareStallRepeat.
	shareStallTTL    = time.Second
	shareStallRepeat = 400 * time.Millisecond
	// shareKeyTTL: counters, runs and the resolved list live this long
	// after their last write.
	shareKeyTTL = 10 * time.Minute
	// shareVerdictSlack: a verdict outlives its ejection by this much.
	shareVerdictSlack = time.Minute
	// throttleWindowTTL: a view's throttling window lapses with it.
	throttleWindowTTL = 2 * time.Minute
	// A lease lives leaseTTLFactor renewal intervals (leaseRenew); its
	// holder stops acting on it after leaseFence of the TTL without a
	// renewal, before another view can take it.
	leaseTTLFactor = 2.5
	leaseFence     = 0.9
	// minLeasePeriod bounds the lease traffic of pools with fast checks.
	minLeasePeriod = 100 * time.Millisecond
)

// ShareConfig makes a pool one view of a shared pool.
type ShareConfig struct {
	// Slot is this view's number among Slots (the worker's id and count):
	// throttling windows are kept per slot.
	Slot, Slots int
	// Notify asks the host for a step (from any goroutine; it must not
	// block): this view has something to publish. false: the host could
	// not take the request.
	Notify func() bool
}

// shareState is the part of Pool that sharing adds.
type shareState struct {
	on         atomic.Bool
	noProbe    atomic.Bool // another view probes
	noResolve  atomic.Bool // another view resolves
	notified   atomic.Bool
	notifiedAt atomic.Int64 // monoNS
	notify     func() bool
	soon       atomic.Bool // a step is asked for in shareSync

	// resolved is the last list this view resolved, resolvedGen counts
	// its changes (under Pool.mu).
	resolved    []Resolved
	resolvedGen uint64

	mu sync.Mutex // one step at a time
	sh *sharer
}

// sharer is the state of a view between steps.
type sharer struct {
	cfg    ShareConfig
	id     string // this view's lease value
	keys   shareKeys
	period time.Duration
	// what the last steps saw and did
	listSeen int64  // the generation of the list applied or published
	listPub  uint64 // resolvedGen last published
	holds    [2]bool
	renewed  [2]int64 // monoNS of the last lease write
	// renew: how often the holder renews a lease (its TTL is
	// leaseTTLFactor times that); watch: when the lease another view
	// holds ends (monoNS; 0: unknown)
	renew      time.Duration
	watch      [2]int64
	attached   int64     // monoNS of Share
	holder     [2]string // the other view holding each lease ("": none)
	holderEnd  [2]int64  // when its lease ends (host ns; 0: its record has no end)
	lostTake   [2]string // the dead holder whose lease another view took over
	watching   map[string]func()
	dead       map[string]bool  // holders whose process exited
	vSeen      int64            // the version as read by the last step that read the runs
	tm         timer            // the pool's one timer (pool_share_tick.go)
	kick       [2]chan struct{} // a role won: its loop's first round
	stallTold  map[string]int64
	lastStep   int64 // monoNS
	exiting    bool
	step       *shareRun
	pre        *shareRun // the next step's first round, handed out (ShareNext)
	lastHadRun map[string]bool
}

// lease kinds
const (
	leaseProbe = iota
	leaseResolve
)

// SetRoles says whether this view runs the active checks and the
// re-resolution. A pool starts with both.
func (p *Pool) SetRoles(probe, resolve bool) {
	p.share.noProbe.Store(!probe)
	p.share.noResolve.Store(!resolve)
}

// Share makes p a view of a shared pool. It gives up both roles until a
// step wins their leases.
func (p *Pool) Share(cfg ShareConfig) {
	s := &p.share
	s.mu.Lock()
	defer s.mu.Unlock()
	var b [8]byte
	_, _ = rand.Read(b[:])
	period := time.Duration(0)
	if p.cfg.Check.Method != "" && p.cfg.Check.Interval > 0 {
		period = p.cfg.Check.Interval
	}
	if p.cfg.Resolve > 0 && p.hasNames() && (period == 0 || p.cfg.Resolve < period) {
		period = p.cfg.Resolve
	}
	if period > 0 {
		period = max(period, minLeasePeriod)
	}
	// The pid first: an operator (and a test) can tell which worker
	// holds a lease.
	id := strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
	s.sh = &sharer{cfg: cfg, id: id, keys: newShareKeys(p.listScope()), period: period, renew: leaseRenew(period), attached: monoNS(p.clk.Now()),
		watching: map[string]func(){}, dead: map[string]bool{},
		stallTold: map[string]int64{}, lastHadRun: map[string]bool{},
		kick: [2]chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}}
	s.notify = cfg.Notify
	p.SetRoles(false, false)
	s.on.Store(true)
	// The timer runs the role rounds, so it runs under either host; it
	// asks for steps only where the host takes the request (Notify).
	p.shareArmLocked(s.sh, monoNS(p.clk.Now()))
	if p.ctx != nil {
		// the watches of the holders' processes end with the pool
		sh, done := s.sh, p.ctx.Done()
		safego.Go("pool share watch", func() {
			<-done
			s.mu.Lock()
			defer s.mu.Unlock()
			sh.stopWatchersLocked()
		}, nil)
	}
}

// roleHeld reports whether this view runs the checks (leaseProbe) or the
// re-resolution (leaseResolve) now: an unshared pool always; a shared
// one while it holds the lease and renewed it within the fence. A view
// whose host stopped stepping (a busy or blocked nginx thread) stops on
// its own before another view can take the lapsed lease.
func (p *Pool) roleHeld(l int) bool {
	s := &p.share
	if l == leaseProbe && s.noProbe.Load() || l == leaseResolve && s.noResolve.Load() {
		return false
	}
	if !s.on.Load() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.sh
	if sh == nil || !sh.holds[l] {
		return false
	}
	fence := int64(leaseFence * leaseTTLFactor * float64(sh.renew))
	return monoNS(p.clk.Now())-sh.renewed[l] <= fence
}

// LeasePeriod is how often a view of p must step for its leases (0: p
// has neither checks nor names to re-resolve, and needs no lease).
func (p *Pool) LeasePeriod() time.Duration {
	p.share.mu.Lock()
	defer p.share.mu.Unlock()
	if sh := p.share.sh; sh != nil {
		return sh.period
	}
	return 0
}

// shareChanged asks for a step: this view has something to publish.
//
// One request is outstanding at a time; one the host did not take (its
// queue full), or did not act on within a second, is asked again.
func (p *Pool) shareChanged() {
	s := &p.share
	if !s.on.Load() || s.notify == nil {
		return
	}
	now := monoNS(p.clk.Now())
	if !s.notified.CompareAndSwap(false, true) {
		if now-s.notifiedAt.Load() < int64(time.Second) {
			return
		}
	}
	s.notifiedAt.Store(now)
	if !s.notify() {
		s.notified.Store(false)
	}
}

// shareSync is how soon a view publishes what calls changed without a
// verdict (its throttling window): the last calls of a burst reach the
// others even when no call follows.
const shareSync = 100 * time.Millisecond

// shareSoon asks for a step within shareSync (one timer at a time).
func (p *Pool) shareSoon() {
	s := &p.share
	if !s.on.Load() || s.notify == nil || !s.soon.CompareAndSwap(false, true) {
		return
	}
	p.clk.AfterFunc(shareSync, safego.Func("pool share timer", func() {
		s.soon.Store(false)
		safego.Inject("pool share timer")
		p.shareChanged()
	}, func() { s.soon.Store(false) }))
}

// hostNS is CLOCK_MONOTONIC (ns) at t: one clock for every process of the
// host, which records between views carry.
func (p *Pool) hostNS(t time.Time) int64 { return monoNS(t) + p.hostOff }

// shareRun is one step in progress: the ops asked, what to do with their
// results.
type shareRun struct {
	phase int
	ops   []StoreOp
	peers []*peer
	gens  []int64 // per peer: g read
	// per peer: the stall key names this view (only then may it delete it)
	stallMine []bool
	// proposals: peers whose verdict goes out, with the health published
	props   []proposal
	runs    []runAdd
	clears  []runAdd // runs this view ended
	leaseOp [2]int   // the lease ops' places (-1: none)
	leaseAt [2]bool  // the lease key was there when read
	// takeover: the lease op is the token of a dead holder's lease
	takeover [2]bool
	runsOp   bool // the runs were read
	wrote    bool
	listOp   bool
	async    bool // its exchanges come through the host's queue
	v        int64
}

type proposal struct {
	pr *peer
	h  health
	op int // its incr among the step's ops
}

type runAdd struct {
	pr  *peer
	gen uint64
	n   int32
	op  int
}

// ShareStep runs one exchange of a step: mode is ShareStep or ShareExit
// to begin one, 0 to go on with the results of the ops the last call
// asked for. It returns the next ops and whether the host must call back
// with their results (false: run them, the step is over). A ShareStep
// may come with the results of the ops ShareNext handed out: the step's
// first round, run by the host as the step began.
func (p *Pool) ShareStep(mode int, res []StoreResult) ([]StoreOp, bool) {
	s := &p.share
	s.mu.Lock()
	defer s.mu.Unlock()
	sh, async := s.sh, mode&ShareAsync != 0
	// A queued exchange would cut short the exit, or a step on the nginx thread that served its ask (notified off).
	if sh == nil || async && (sh.exiting || !s.notified.Load() && sh.step != nil && !sh.step.async) {
		return nil, false
	}
	now := p.clk.Now()
	switch mode &^ ShareAsync {
	case ShareStep, ShareExit:
		mode &^= ShareAsync
		// Notified off: a step begun since served this queued one's ask; its first round's results may predate that step.
		fresh := !async || s.notified.Load()
		s.notified.Store(false)
		sh.step = &shareRun{async: async}
		if mode == ShareExit {
			sh.exiting = true
			p.SetRoles(false, false)
		}
		pre := sh.pre
		sh.pre = nil
		if mode == ShareStep && fresh && res != nil && pre != nil && len(res) == len(pre.ops) &&
			slices.Equal(pre.peers, p.set.Load().peers) {
			sh.step, pre.async = pre, async
			return p.shareReadMore(sh, now, res)
		}
		return p.shareRead(sh, now), true
	}
	st := sh.step
	if st != nil && st.async != async {
		return nil, false
	}
	if st == nil || len(res) != len(st.ops) {
		sh.step = nil
		return nil, false
	}
	switch st.phase {
	case 1:
		return p.shareReadMore(sh, now, res)
	case 2:
		return p.shareWrite(sh, now, res)
	case 3:
		return p.shareCommit(sh, now, res)
	}
	sh.step = nil
	return nil, false
}

func get(key string) StoreOp { return StoreOp{Kind: OpGet, Key: key} }

// shareRead is a step's first round: the version, the leases, the list's
// generation, every server's verdict generation and stall key, the other
// slots' throttling windows.
func (p *Pool) shareRead(sh *sharer, now time.Time) []StoreOp {
	st := sh.step
	st.phase = 1
	st.ops = append(st.ops, get("v"), get(sh.keys.lease[leaseProbe]), get(sh.keys.lease[leaseResolve]), get(sh.keys.rg))
	if sh.exiting {
		return st.ops
	}
	st.peers = slices.Clone(p.set.Load().peers)
	for _, pr := range st.peers {
		st.ops = append(st.ops, get("g:"+pr.addr), get("t:"+pr.addr))
	}
	if p.throttle != nil {
		for i := range sh.cfg.Slots {
			if i != sh.cfg.Slot {
				is := strconv.Itoa(i)
				st.ops = append(st.ops, get("tr:"+is), get("ta:"+is))
			}
		}
	}
	return st.ops
}

func num(b []byte) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if n == 0 {
		f, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		n = int64(f)
	}
	return n
}

// shareReadMore takes the first round's results and reads the verdicts
// newer than this view's, the runs and the resolved list.
func (p *Pool) shareReadMore(sh *sharer, now time.Time, res []StoreResult) ([]StoreOp, bool) {
	st := sh.step
	st.v = num(res[0].Value)
	leases := [2][]byte{res[1].Value, res[2].Value}
	rg := num(res[3].Value)
	nowNS := monoNS(now)
	if sh.exiting {
		// Give up what this view holds; the rest is the others'.
		var ops []StoreOp
		for k, v := range leases {
			if id, _ := leaseParse(v); id == sh.id {
				ops = append(ops, StoreOp{Kind: OpDelete, Key: sh.keys.lease[k]})
			}
		}
		if len(ops) > 0 {
			// the version moves: a view that takes calls steps at its
			// next one, and takes the lease
			ops = append(ops, StoreOp{Kind: OpIncr, Key: "v", Delta: 1, Init: p.hostNS(now) / 1e6, TTL: shareKeyTTL})
		}
		sh.holds = [2]bool{}
		sh.step = nil
		sh.stopWatchersLocked()
		if sh.tm != nil {
			sh.tm.Stop()
		}
		return ops, false
	}
	// Leases: a view holds one while the key names it; it stops acting on
	// it when the key names another (it was evicted and taken) or when it
	// has not renewed it in time.
	hostNow := p.hostNS(now)
	for k, v := range leases {
		id, end := leaseParse(v)
		st.leaseAt[k] = v != nil
		if sh.holds[k] && (v != nil && id != sh.id || nowNS-sh.renewed[k] > int64(leaseFence*leaseTTLFactor*float64(sh.renew))) {
			sh.holds[k] = false
		}
		// Another view's lease: this view steps again when it ends (a
		// record without an end: after a period).
		sh.watch[k] = 0
		sh.holder[k] = ""
		sh.holderEnd[k] = 0
		if v != nil && id != sh.id {
			sh.holder[k] = id
			sh.holderEnd[k] = end
			sh.watch[k] = nowNS + int64(sh.period)
			if end != 0 {
				sh.watch[k] = nowNS + max(0, end-hostNow)
			}
		}
	}
	p.watchHoldersLocked(sh)
	p.SetRoles(sh.holds[leaseProbe], sh.holds[leaseResolve])
	i := 4
	st.gens = make([]int64, len(st.peers))
	st.stallMine = make([]bool, len(st.peers))
	st.ops = st.ops[:0]
	for j, pr := range st.peers {
		g, t := res[i].Value, res[i+1]
		i += 2
		st.gens[j] = num(g)
		st.stallMine[j] = string(t.Value) == sh.id
		h := pr.h.Load()
		// another view's stall verdict (this view's own is its own)
		var until int64
		if t.Value != nil && string(t.Value) != sh.id {
			until = nowNS + int64(shareStallTTL)
		}
		if (until != 0) != (h.remoteStall != 0) || until != 0 {
			p.transition(pr, event{kind: evRemoteStall, until: until, now: nowNS})
		}
		if st.gens[j] > int64(h.gen) {
			st.ops = append(st.ops, get("c:"+pr.addr+":"+strconv.FormatInt(st.gens[j], 10)))
		}
	}
	if p.throttle != nil {
		var r, a int64
		for ; i+1 < len(res); i += 2 {
			r += num(res[i].Value)
			a += num(res[i+1].Value)
		}
		p.SetOthersThrottle(r, a)
	}
	// The runs: unless the version is the one this view read them at
	// (every write to a run moves it) and this view is in none.
	st.runsOp = st.v != sh.vSeen
	for _, had := range sh.lastHadRun {
		st.runsOp = st.runsOp || had
	}
	if st.runsOp {
		sh.vSeen = st.v
		for j, pr := range st.peers {
			st.ops = append(st.ops, get("f:"+pr.addr+":"+strconv.FormatInt(st.gens[j], 10)))
		}
	}
	st.listOp = false
	if !sh.holds[leaseResolve] && p.cfg.Resolve > 0 && p.hasNames() && rg > sh.listSeen {
		st.ops = append(st.ops, get(sh.keys.rl))
		st.listOp = true
		sh.listSeen = rg
	}
	st.phase = 2
	if len(st.ops) == 0 {
		return p.shareWrite(sh, now, nil)
	}
	return st.ops, true
}

// shareWrite applies what the others published, then writes this view's
// news: lease renewals, new verdicts (their generations first), failures
// added to the runs, stall verdicts, the throttling window, the list.
func (p *Pool) shareWrite(sh *sharer, now time.Time, res []StoreResult) ([]StoreOp, bool) {
	st := sh.step
	nowNS := monoNS(now)
	hostNow := p.hostNS(now)
	k := 0
	for j, pr := range st.peers {
		if st.gens[j] <= int64(pr.h.Load().gen) {
			continue
		}
		r := res[k]
		k++
		if rec, ok := decodeVerdict(r.Value); ok {
			p.transition(pr, event{kind: evImport, gen: uint64(st.gens[j]), eject: rec.eject,
				until: nowNS + (rec.until - hostNow), ejectFor: rec.ejectFor, now: nowNS})
		}
	}
	for j, pr := range st.peers {
		if !st.runsOp {
			break
		}
		n := num(res[k].Value)
		k++
		h := pr.h.Load()
		had := sh.lastHadRun[pr.addr]
		switch {
		case n > 0 && uint64(st.gens[j]) == h.runGen && int64(h.fails) < n:
			p.transition(pr, event{kind: evRun, gen: h.runGen, n: int32(min(n, 1<<30)), now: nowNS})
		case n == 0 && had && h.fails > 0 && uint64(st.gens[j]) == h.runGen:
			// the run this view took in was ended by another
			p.transition(pr, event{kind: evRunGone, gen: h.runGen, now: nowNS})
		case n > 0 && had && h.fails == 0 && pr.progressAt.Load() > sh.lastStep && uint64(st.gens[j]) == h.runGen:
			// The run is on, and this view had an answer since its last
			// step: the run ends (a new verdict generation starts another).
			p.transition(pr, event{kind: evRunEnd, gen: h.runGen, now: nowNS})
		}
		sh.lastHadRun[pr.addr] = n > 0
	}
	if st.listOp {
		if list, ok := decodeList(res[k].Value); ok && len(list) > 0 {
			if err := p.ImportResolved(list); err != nil {
				p.log.Warn("qrpc shared pool: resolved list not applied", "err", err)
			}
		}
		k++
	}
	_ = k
	// forget what servers gone from the pool left behind
	for a := range sh.stallTold {
		if !hasPeer(st.peers, a) {
			delete(sh.stallTold, a)
		}
	}
	for a := range sh.lastHadRun {
		if !hasPeer(st.peers, a) {
			delete(sh.lastHadRun, a)
		}
	}

	ops := st.ops[:0]
	st.leaseOp = [2]int{-1, -1}
	// leases
	if sh.period > 0 {
		ttl := time.Duration(leaseTTLFactor * float64(sh.renew))
		want := [2]bool{p.cfg.Check.Method != "" && p.cfg.Check.Interval > 0, p.cfg.Resolve > 0 && p.hasNames()}
		for l := range 2 {
			if !want[l] {
				continue
			}
			if sh.holds[l] {
				if nowNS-sh.renewed[l] >= int64(sh.renew)*9/10 {
					st.leaseOp[l] = len(ops)
					ops = append(ops, StoreOp{Kind: OpSet, Key: sh.keys.lease[l], Value: leaseValue(sh.id, hostNow+int64(ttl)), TTL: ttl})
					sh.renewed[l] = nowNS
				}
			} else if !st.leaseAt[l] {
				// a lease another view holds is not tried: the add
				// would fail
				st.leaseOp[l] = len(ops)
				ops = append(ops, StoreOp{Kind: OpAdd, Key: sh.keys.lease[l], Value: leaseValue(sh.id, hostNow+int64(ttl)), TTL: ttl})
			} else if id := sh.holder[l]; id != "" && sh.dead[id] &&
				(sh.holderEnd[l] == 0 || sh.holderEnd[l]-hostNow > int64(takeoverMargin)) {
				// The holder's process exited: of the views that saw
				// it, the one that adds the token takes the lease. A
				// lease about to end is left to end instead: the
				// taker's set of the lease would overwrite the lease
				// another view adds once it has lapsed.
				st.leaseOp[l] = len(ops)
				st.takeover[l] = true
				ops = append(ops, StoreOp{Kind: OpAdd, Key: sh.keys.token[l] + id, Value: []byte(sh.id), TTL: ttl})
			}
		}
	}
	// verdict generations of this view's news
	st.props = st.props[:0]
	st.runs = st.runs[:0]
	st.clears = st.clears[:0]
	for _, pr := range st.peers {
		h := pr.h.Load()
		if h.dirty() {
			st.props = append(st.props, proposal{pr: pr, h: *h, op: len(ops)})
			ops = append(ops, StoreOp{Kind: OpIncr, Key: "g:" + pr.addr, Delta: 1, Init: hostNow / 1e6, TTL: shareKeyTTL})
			continue
		}
		if h.endRun && h.unshown == 0 {
			st.clears = append(st.clears, runAdd{pr: pr, gen: h.runGen})
			ops = append(ops, StoreOp{Kind: OpDelete, Key: "f:" + pr.addr + ":" + strconv.FormatUint(h.runGen, 10)})
			st.wrote = true
			continue
		}
		if h.unshown > 0 {
			st.runs = append(st.runs, runAdd{pr: pr, gen: h.runGen, n: h.unshown, op: len(ops)})
			ops = append(ops, StoreOp{Kind: OpIncr, Key: "f:" + pr.addr + ":" + strconv.FormatUint(h.runGen, 10), Delta: int64(h.unshown), TTL: shareKeyTTL})
		}
	}
	// stall verdicts, repeated while they hold
	clk := pickClock{t: now, src: p.clk}
	for j, pr := range st.peers {
		if pr.stalled(pr.inflight.Load(), &clk, int64(p.cfg.Stall)) {
			if nowNS >= sh.stallTold[pr.addr] {
				ops = append(ops, StoreOp{Kind: OpSet, Key: "t:" + pr.addr, Value: []byte(sh.id), TTL: shareStallTTL})
				sh.stallTold[pr.addr] = nowNS + int64(shareStallRepeat)
				st.wrote = true
			}
		} else if _, ok := sh.stallTold[pr.addr]; ok {
			delete(sh.stallTold, pr.addr)
			if st.stallMine[j] {
				// another view's stall verdict stays its own
				ops = append(ops, StoreOp{Kind: OpDelete, Key: "t:" + pr.addr})
				st.wrote = true
			}
		}
	}
	if th := p.throttle; th != nil {
		r, a := th.counts(now)
		is := strconv.Itoa(sh.cfg.Slot)
		ops = append(ops,
			StoreOp{Kind: OpSet, Key: "tr:" + is, Value: []byte(strconv.FormatInt(r, 10)), TTL: throttleWindowTTL},
			StoreOp{Kind: OpSet, Key: "ta:" + is, Value: []byte(strconv.FormatInt(a, 10)), TTL: throttleWindowTTL})
	}
	// The resolver's list: whenever it changed, and when this view has
	// just become the resolver (the others may hold an older one).
	if sh.holds[leaseResolve] {
		p.mu.Lock()
		gen, list := p.share.resolvedGen, p.share.resolved
		p.mu.Unlock()
		if gen != sh.listPub && len(list) > 0 {
			ops = append(ops,
				StoreOp{Kind: OpSet, Key: sh.keys.rl, Value: encodeList(list), TTL: shareKeyTTL},
				StoreOp{Kind: OpIncr, Key: sh.keys.rg, Delta: 1, Init: hostNow / 1e6, TTL: shareKeyTTL})
			sh.listPub = gen
			st.wrote = true
		}
	}
	st.ops = ops
	st.phase = 3
	// No op whose result counts (a lease tried, a generation or a run
	// counted): the step ends with these ops, one exchange fewer.
	need := len(st.props) > 0 || len(st.runs) > 0
	for l, k := range st.leaseOp {
		need = need || k >= 0 && !sh.holds[l]
	}
	if !need {
		more, _ := p.shareCommit(sh, now, nil)
		return append(ops, more...), false
	}
	return ops, true
}

func hasPeer(peers []*peer, addr string) bool {
	for _, pr := range peers {
		if pr.addr == addr {
			return true
		}
	}
	return false
}

// shareCommit takes the writes' results: leases won, generations got,
// runs as they stand; then writes the verdicts under their generations
// and bumps the version when the others have something to read.
func (p *Pool) shareCommit(sh *sharer, now time.Time, res []StoreResult) ([]StoreOp, bool) {
	st := sh.step
	nowNS := monoNS(now)
	hostNow := p.hostNS(now)
	var ops []StoreOp
	for l, k := range st.leaseOp {
		if k >= 0 && st.takeover[l] && !res[k].OK && sh.lostTake[l] != sh.holder[l] {
			// Another view won the takeover and sets the lease now:
			// read it again soon, to watch the winner's process as
			// any holder's (once per dead holder).
			sh.lostTake[l] = sh.holder[l]
			sh.watch[l] = nowNS + int64(shareSync)
		}
		if k >= 0 && st.ops[k].Kind == OpAdd && res[k].OK {
			if st.takeover[l] {
				ttl := time.Duration(leaseTTLFactor * float64(sh.renew))
				ops = append(ops, StoreOp{Kind: OpSet, Key: sh.keys.lease[l], Value: leaseValue(sh.id, hostNow+int64(ttl)), TTL: ttl})
				sh.holder[l] = ""
			}
			sh.holds[l] = true
			sh.renewed[l] = nowNS
			sh.watch[l] = 0
			sh.kickLocked(l) // the role's first round, now
			if l == leaseResolve {
				sh.listPub = 0 // publish the list at the next step
			}
		}
	}
	p.SetRoles(sh.holds[leaseProbe], sh.holds[leaseResolve])
	for _, pp := range st.props {
		r := res[pp.op]
		if !r.OK {
			continue
		}
		h := pp.h
		rec := verdictRec{eject: h.ejected(), ejectFor: h.ejectFor}
		if h.ejected() {
			rec.until = h.until - nowNS + hostNow
		}
		ttl := shareVerdictSlack
		if h.ejected() {
			ttl += time.Duration(max(0, h.until-nowNS))
		}
		ops = append(ops, StoreOp{Kind: OpAdd, Key: "c:" + pp.pr.addr + ":" + strconv.FormatInt(r.N, 10), Value: rec.encode(), TTL: ttl})
		p.transition(pp.pr, event{kind: evPublished, gen: uint64(r.N), seq: h.seq, now: nowNS})
		st.wrote = true
	}
	for _, ra := range st.runs {
		r := res[ra.op]
		if !r.OK {
			continue
		}
		total := r.N
		reached := total >= int64(p.cfg.Failures) && total-int64(ra.n) < int64(p.cfg.Failures)
		p.transition(ra.pr, event{kind: evRun, gen: ra.gen, n: int32(min(total, 1<<30)), seq: uint64(ra.n), reached: reached, now: nowNS})
		st.wrote = true
	}
	for _, c := range st.clears {
		p.transition(c.pr, event{kind: evRunCleared, gen: c.gen, now: nowNS})
	}
	if st.wrote {
		ops = append(ops, StoreOp{Kind: OpIncr, Key: "v", Delta: 1, Init: hostNow / 1e6, TTL: shareKeyTTL})
	}
	sh.lastStep = nowNS
	sh.step = nil
	p.shareArmLocked(sh, nowNS)
	// What changed during this step asks for the next one.
	for _, pr := range st.peers {
		if h := pr.h.Load(); h.dirty() || h.unshown > 0 {
			p.shareChanged()
			break
		}
	}
	return ops, false
}
