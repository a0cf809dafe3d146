package qrpc

import (
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash"
	"hash/fnv"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// The deterministic simulation of pools: the real pool code (pick and
// its balancers, calls with retries, hedges, the retry budget,
// throttling, stalls, SRV tiers and weights, health checks, re-resolution
// through apply, shared state through ShareStep and its record encoding)
// run by several views (nginx workers) of two pools that share one store,
// against simulated servers, in virtual time on one goroutine. Every
// random choice comes from one PCG seeded with the run's seed, so a run
// replays exactly; invariants are checked after every event.
//
// What the simulation stands in for, and how:
//   - the clock: each view has its own (simClock), offset from the others
//     as separate processes' monotonic clocks are; their hostOff puts
//     them on one CLOCK_MONOTONIC, as the host has. Timers are events.
//   - the network: a simBackend per (view, server) answers calls after a
//     random latency, or fails them as its server's state says; Pending
//     is a real one, over a qconn that holds only the pending table, so
//     that Pending.Cancel is the client's own.
//   - the store: memStore (share_store_test.go), the ops of a step run
//     as share.lua runs them, each round of a step its own event, so that
//     other views and calls interleave between rounds as they do between
//     workers.
//   - new servers: apply takes a server the view has never had from its
//     draining servers (a server back before it drained), which the
//     simulation fills with a peer on a simBackend for every address the
//     view lacks (seed): apply's other path dials a real Client.
//   - removed servers: apply drains them on goroutines; the pool's
//     context is cancelled (the drain goroutine then leaves a busy server
//     in place) and the simulation waits for them after every apply,
//     then runs drain itself, on its goroutine, once a server is idle.

var (
	simSeed  = flag.Uint64("sim.seed", 0, "pool simulation: run only this seed (0: the test's seeds)")
	simSteps = flag.Int("sim.steps", 0, "pool simulation: events per seed (0: the test's)")
	simTrace = flag.Bool("sim.trace", false, "pool simulation: print every event")
)

// ---- virtual time --------------------------------------------------------

type simEvent struct {
	at    int64 // virtual ns
	seq   uint64
	label string
	fn    func()
	dead  bool
	fired bool
}

type simHeap []*simEvent

func (h simHeap) Len() int { return len(h) }
func (h simHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h simHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simHeap) Push(x any)   { *h = append(*h, x.(*simEvent)) }
func (h *simHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// simClock is one view's clock: virtual time plus the view's offset (its
// process's monotonic clock started elsewhere).
type simClock struct {
	w   *simWorld
	off int64
}

func (c *simClock) Now() time.Time { return c.w.timeAt(c.w.now + c.off) }

func (c *simClock) AfterFunc(d time.Duration, f func()) timer {
	t := &simTimer{w: c.w, f: f}
	t.arm(d)
	return t
}

type simTimer struct {
	w  *simWorld
	f  func()
	ev *simEvent
}

func (t *simTimer) arm(d time.Duration) {
	t.ev = t.w.at(t.w.now+int64(max(d, 0)), "timer", t.f)
}

func (t *simTimer) Stop() bool {
	if t.ev == nil || t.ev.dead || t.ev.fired {
		return false
	}
	t.ev.dead = true
	return true
}

func (t *simTimer) Reset(d time.Duration) bool {
	was := t.Stop()
	t.arm(d)
	return was
}

// timeRepr is time.Time's layout: a wall clock step moves the wall
// reading of a time and keeps its monotonic one, which only unsafe can
// build (the kernel does it to time.Now).
type timeRepr struct {
	wall uint64
	ext  int64
	loc  *time.Location
}

// shiftWall moves t's wall reading by sec seconds, its monotonic reading
// unchanged.
func shiftWall(t time.Time, sec int64) time.Time {
	r := (*timeRepr)(unsafe.Pointer(&t))
	if r.wall&(1<<63) == 0 {
		panic("shiftWall: a time without a monotonic reading")
	}
	r.wall += uint64(sec) << 30
	return t
}

// ---- the world -----------------------------------------------------------

// simKnobs are a run's fault rates.
type simKnobs struct {
	refusePct   int   // per attempt: refused, never sent (%)
	lossPermil  int   // per attempt: connection lost mid-call (‰)
	faultEvery  int64 // mean ns between faults (0: none)
	arriveEvery int64 // mean ns between calls (0: none)
	storeMax    int   // memStore's size (0: no eviction)
	dnsChanges  bool
	exits       bool
}

type simWorld struct {
	tb    testing.TB
	seed  uint64
	rng   *rand.Rand
	knobs simKnobs

	now     int64
	seq     uint64
	q       simHeap
	events  int
	wall    int64 // the wall clock's steps so far (s)
	walls   bool  // apply them (a run without them must trace the same)
	hostNS  int64 // CLOCK_MONOTONIC at virtual 0
	liveCtx context.Context
	deadCtx context.Context
	stopped bool // draining: no new calls nor faults

	store   *memStore
	writer  map[string]string // full key: the pool that wrote it
	evicted int

	servers []*simServer
	pools   []*simPool
	calls   []*simCall
	open    int // calls neither done nor cancelled

	h       hash.Hash64
	trace   bool
	recent  []string // the last lines, for a failure
	failure string

	panicMu sync.Mutex
	panics  []string
}

func newSimWorld(tb testing.TB, seed uint64, knobs simKnobs) *simWorld {
	w := &simWorld{tb: tb, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x51a7e)), knobs: knobs,
		now: int64(time.Hour), writer: map[string]string{}, h: fnv.New64a(), trace: *simTrace}
	w.hostNS = int64(time.Hour) + w.rng.Int64N(int64(1000*time.Hour))
	w.liveCtx = context.Background()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.deadCtx = ctx
	w.store = newMemStore(func() int64 { return w.now }, knobs.storeMax)
	return w
}

// timeAt is the time.Time of virtual ns on a view's clock.
func (w *simWorld) timeAt(ns int64) time.Time {
	t := monoBase.Add(time.Duration(ns))
	if w.walls && w.wall != 0 {
		t = shiftWall(t, w.wall)
	}
	return t
}

func (w *simWorld) at(when int64, label string, fn func()) *simEvent {
	w.seq++
	ev := &simEvent{at: max(when, w.now), seq: w.seq, label: label, fn: fn}
	heap.Push(&w.q, ev)
	return ev
}

func (w *simWorld) after(d time.Duration, label string, fn func()) *simEvent {
	return w.at(w.now+int64(d), label, fn)
}

// dur is a random duration in [lo, hi).
func (w *simWorld) dur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)))
}

// exp is an exponentially distributed delay of the given mean.
func (w *simWorld) exp(mean int64) time.Duration {
	return time.Duration(w.rng.ExpFloat64()*float64(mean)) + 1
}

func (w *simWorld) tracef(format string, args ...any) {
	line := fmt.Sprintf("%d.%06d ", (w.now-int64(time.Hour))/1e9, (w.now-int64(time.Hour))%1e9/1e3) + fmt.Sprintf(format, args...)
	w.h.Write([]byte(line))
	w.h.Write([]byte{'\n'})
	if w.trace {
		w.tb.Log(line)
	}
	if len(w.recent) >= 40 {
		copy(w.recent, w.recent[1:])
		w.recent = w.recent[:39]
	}
	w.recent = append(w.recent, line)
}

func (w *simWorld) failf(format string, args ...any) {
	if w.failure == "" {
		w.failure = fmt.Sprintf(format, args...)
	}
}

// replay is the command that runs this world's seed again.
func (w *simWorld) replay(steps int) string {
	return fmt.Sprintf("go test ./qrpc/ -run TestPoolSimulation -sim.seed=%d -sim.steps=%d -v", w.seed, steps)
}

// step runs the next event and checks the invariants; false when none
// is left.
func (w *simWorld) step() bool {
	var ev *simEvent
	for w.q.Len() > 0 {
		if e := heap.Pop(&w.q).(*simEvent); !e.dead {
			ev = e
			break
		}
	}
	if ev == nil {
		return false
	}
	w.now = ev.at
	w.events++
	ev.fired = true
	func() {
		defer func() {
			if v := recover(); v != nil {
				w.failf("panic in %s: %v\n%s", ev.label, v, debug.Stack())
			}
		}()
		ev.fn()
	}()
	w.afterEvent(ev.label)
	return true
}

// runFor runs the events of the next d of virtual time.
func (w *simWorld) runFor(d time.Duration) {
	end := w.now + int64(d)
	for w.failure == "" && w.q.Len() > 0 && w.q[0].at <= end {
		w.step()
	}
	w.now = max(w.now, end)
}

// drain stops new calls and faults and runs until no call is open
// (bounded: every call has a deadline).
func (w *simWorld) drain() {
	w.stopped = true
	for _, s := range w.servers {
		s.frozen, s.fastFail = false, false
	}
	end := w.now + int64(time.Minute)
	for n := 0; w.open > 0 && w.failure == "" && n < 1_000_000 && w.now < end; n++ {
		if !w.step() {
			break
		}
	}
	if w.open > 0 && w.failure == "" {
		w.failf("%d calls still open a minute after the end", w.open)
	}
}

// ---- servers and their clients ------------------------------------------

type simServer struct {
	idx      int
	addr     string
	target   string // its SRV target (and TLS name)
	dead     bool
	frozen   bool
	fastFail bool
	overload bool          // answers most calls with code 7
	slow     time.Duration // base latency
	epoch    int           // bumped by each kill
	backends []*simBackend
	hits     int // attempts sent to it
}

// simBackend is a view's client of a server.
type simBackend struct {
	w         *simWorld
	srv       *simServer
	pr        *peer
	qc        *qconn
	next      uint64
	out       map[uint64]bool // pending ids
	connected bool
	epoch     int
	dialing   bool
	closed    atomic.Bool
}

func (w *simWorld) newBackend(s *simServer, pr *peer) *simBackend {
	b := &simBackend{w: w, srv: s, pr: pr, qc: &qconn{}, out: map[uint64]bool{}}
	b.qc.pending.init()
	s.backends = append(s.backends, b)
	b.dial(w.dur(0, 5*time.Millisecond))
	return b
}

// dial connects after d, and goes on trying while the server is down.
func (b *simBackend) dial(d time.Duration) {
	if b.dialing || b.closed.Load() {
		return
	}
	b.dialing = true
	b.w.after(d, "dial", func() {
		b.dialing = false
		if b.closed.Load() || b.connected {
			return
		}
		if b.srv.dead {
			b.dial(b.w.dur(50*time.Millisecond, 300*time.Millisecond))
			return
		}
		b.connected, b.epoch = true, b.srv.epoch
		b.w.tracef("up %s", b.srv.addr)
		b.pr.refresh()
	})
}

// lose ends the connection: its calls fail, connection lost.
func (b *simBackend) lose() {
	if !b.connected || b.epoch == b.srv.epoch {
		return
	}
	b.connected = false
	b.pr.refresh()
	ids := make([]uint64, 0, len(b.out))
	for id := range b.out {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		b.finish(id, nil, fmt.Errorf("%w: sim: server gone", ErrConnLost))
	}
	b.dial(b.w.dur(20*time.Millisecond, 200*time.Millisecond))
}

func (b *simBackend) up() bool { return b.connected && !b.closed.Load() }

func (b *simBackend) Start(call *Call, done Done) (Pending, error) {
	w := b.w
	if b.closed.Load() {
		return Pending{}, ErrClosed
	}
	if !b.connected {
		return Pending{}, fmt.Errorf("%w: sim: %s not connected", ErrUnavailable, b.srv.addr)
	}
	if w.rng.IntN(100) < w.knobs.refusePct {
		return Pending{}, fmt.Errorf("%w: sim: %s refused", ErrUnavailable, b.srv.addr)
	}
	if len(call.Body) == 8 {
		id := binary.LittleEndian.Uint64(call.Body)
		if id < uint64(len(w.calls)) {
			c := w.calls[id]
			c.sends++
			if c.sends > c.limit {
				w.failf("call %d sent %d times, at most %d (1 + retries + hedges)", id, c.sends, c.limit)
			}
		}
	}
	b.srv.hits++
	b.next++
	id := b.next
	b.qc.pending.store(id, &pendingCall{id: id, done: done, st: &cstream{}})
	b.out[id] = true
	left := time.Duration(-1)
	if !call.Deadline.IsZero() {
		left = max(call.Deadline.Sub(b.pr.pool.clk.Now()), 0)
	}
	s := b.srv
	var resp *Response
	var err error
	var d time.Duration
	switch {
	case s.dead || s.frozen:
		if left < 0 {
			return Pending{s: b.qc, id: id}, nil // no answer: the loss ends it
		}
		d, err = left, fmt.Errorf("%w: sim: no answer", ErrTimeout)
	case s.fastFail:
		d, err = w.dur(50*time.Microsecond, time.Millisecond), fmt.Errorf("%w: sim: reset", ErrConnLost)
	default:
		d = s.slow + w.exp(int64(2*time.Millisecond))
		switch {
		case w.rng.IntN(1000) < w.knobs.lossPermil:
			d, err = w.dur(0, d), fmt.Errorf("%w: sim: stream reset", ErrConnLost)
		case left >= 0 && d >= left:
			d, err = left, fmt.Errorf("%w: sim: no answer in time", ErrTimeout)
		default:
			resp = &Response{}
			if s.overload && w.rng.IntN(10) < 7 {
				resp.Code = 7
			}
		}
	}
	w.after(d, "answer", func() { b.finish(id, resp, err) })
	return Pending{s: b.qc, id: id}, nil
}

// finish delivers an attempt's outcome, unless it was cancelled.
func (b *simBackend) finish(id uint64, resp *Response, err error) {
	delete(b.out, id)
	pc := b.qc.pending.take(id)
	if pc == nil {
		return
	}
	if b.closed.Load() && err == nil {
		resp, err = nil, ErrClosed
	}
	pc.done(resp, err)
}

func (b *simBackend) Event(method []byte, headers [][]byte, body []byte) error {
	if !b.up() {
		return fmt.Errorf("%w: sim: %s not connected", ErrUnavailable, b.srv.addr)
	}
	return nil
}

// Unary is the active check: answered at once, as the server's state
// says (its latency is not the check's subject).
func (b *simBackend) Unary(ctx context.Context, method string, body []byte, headers ...[]byte) (*Response, error) {
	s := b.srv
	switch {
	case b.closed.Load():
		return nil, ErrClosed
	case !b.connected:
		return nil, fmt.Errorf("%w: sim: %s not connected", ErrUnavailable, s.addr)
	case s.dead || s.frozen:
		return nil, fmt.Errorf("%w: sim: check", ErrTimeout)
	case s.fastFail:
		return nil, fmt.Errorf("%w: sim: check", ErrConnLost)
	}
	return &Response{}, nil
}

// Close may run on a drain goroutine: it only marks the client closed
// (an answer still on its way fails closed).
func (b *simBackend) Close() error { b.closed.Store(true); return nil }

func (b *simBackend) Stats() Stats       { return Stats{} }
func (b *simBackend) liveConns() int     { return map[bool]int{false: 0, true: 1}[b.up()] }
func (b *simBackend) lastDialErr() error { return nil }

// ---- the observer ---------------------------------------------------------

// simObserver counts what the pool reports, per server: the gauges must
// come back to what the servers are once the calls drain.
type simObserver struct {
	mu    sync.Mutex
	peers []*simPeerObs
}

type simPeerObs struct {
	addr     string
	inflight atomic.Int64
	state    atomic.Int32
}

func (o *simObserver) Peer(addr string) observe.PeerObserver {
	po := &simPeerObs{addr: addr}
	po.state.Store(-1)
	o.mu.Lock()
	o.peers = append(o.peers, po)
	o.mu.Unlock()
	return po
}

func (po *simPeerObs) CallDone([]byte, uint32, error, time.Duration) {}
func (po *simPeerObs) EventDone([]byte, error)                       {}
func (po *simPeerObs) InflightAdd(d int)                             { po.inflight.Add(int64(d)) }
func (po *simPeerObs) StateChanged(s observe.PeerState)              { po.state.Store(int32(s)) }
func (po *simPeerObs) Reconnected()                                  {}
func (po *simPeerObs) Ejected()                                      {}
func (po *simPeerObs) Retried(error)                                 {}
func (po *simPeerObs) Hedged()                                       {}
func (po *simPeerObs) BudgetExhausted()                              {}
func (po *simPeerObs) BytesSent(int)                                 {}
func (po *simPeerObs) BytesReceived(int)                             {}

// ---- pools and their views ------------------------------------------------

type simPool struct {
	w      *simWorld
	name   string
	prefix string
	cfg    PoolConfig
	srv    bool
	dns    []Resolved // what the name resolves to now
	views  []*simView // every view ever, gone ones too
	slots  int
	// lastDisturb is when the leases were last disturbed (a view came or
	// went, the store evicted).
	lastDisturb int64
	period      time.Duration
}

type simView struct {
	sp       *simPool
	slot     int
	gen      int // the slot's incarnation
	p        *Pool
	clk      *simClock
	obs      *simObserver
	gone     bool // exited or died: no calls, steps, checks
	exiting  bool
	exitNext bool // exit once the step in progress is over
	wantStep atomic.Bool
	stepSoon bool
	stepping bool
	again    bool
	// pre: the next step's first round, handed out with the last one's
	// answer (ShareNext), run as that step begins, as share.lua does
	pre     []StoreOp
	seeded  map[*peer]bool
	all     []*peer
	ejected map[*peer]bool // as of the last check
	took    map[*peer]bool // up and not ejected, as of the last check
	// the set as of the last check
	prevSetPtr *peerSet
	// what the step in progress must bring: per peer, the generation in
	// the store at its start
	reach    map[*peer]int64
	reachEvs int
}

func (v *simView) String() string { return fmt.Sprintf("%s/%d.%d", v.sp.name, v.slot, v.gen) }

func (w *simWorld) addServers(n int, dual map[int]bool) {
	for i := range n {
		s := &simServer{idx: len(w.servers), addr: "10.9.0." + strconv.Itoa(i+1) + ":8443", target: "t" + strconv.Itoa(i) + ".sim.test"}
		w.servers = append(w.servers, s)
		if dual[i] {
			w.servers = append(w.servers, &simServer{idx: len(w.servers), addr: "[fd00::" + strconv.Itoa(i+1) + "]:8443", target: s.target})
		}
	}
}

func (w *simWorld) server(addr string) *simServer {
	for _, s := range w.servers {
		if s.addr == addr {
			return s
		}
	}
	return nil
}

// dnsList is what the pool's name resolves to with the servers of the
// given targets: an SRV name gives each target's addresses its record's
// priority and weight (split among them); a plain name, all of them.
func (sp *simPool) dnsList(targets map[string]bool, prio, weight map[string]uint16) []Resolved {
	var out []Resolved
	split := map[string]uint16{}
	for _, s := range sp.w.servers {
		split[s.target]++
	}
	for _, s := range sp.w.servers {
		if !targets[s.target] {
			continue
		}
		if sp.srv {
			out = append(out, Resolved{Addr: s.addr, Name: s.target, Priority: prio[s.target], Weight: weight[s.target], Split: split[s.target]})
		} else {
			out = append(out, Resolved{Addr: s.addr, Name: "svc.sim.test", Weight: 1, Split: 1})
		}
	}
	return out
}

func (w *simWorld) newPool(name string, cfg PoolConfig, srv bool, slots int) *simPool {
	sp := &simPool{w: w, name: name, prefix: name + ":", cfg: cfg, srv: srv, slots: slots, lastDisturb: w.now}
	all := map[string]bool{}
	for _, s := range w.servers {
		all[s.target] = true
	}
	sp.dns = sp.dnsList(all, nil, nil)
	w.pools = append(w.pools, sp)
	for i := range slots {
		sp.addView(i)
	}
	return sp
}

func (sp *simPool) addView(slot int) *simView {
	w := sp.w
	gen := 0
	for _, o := range sp.views {
		if o.slot == slot {
			gen = max(gen, o.gen+1)
		}
	}
	v := &simView{sp: sp, slot: slot, gen: gen, obs: &simObserver{}, seeded: map[*peer]bool{}, ejected: map[*peer]bool{}, took: map[*peer]bool{}}
	cfg := sp.cfg
	cfg.Observer = v.obs
	pc, conf, err := cfg.populate()
	if err != nil {
		w.failf("config: %v", err)
		return v
	}
	v.clk = &simClock{w: w, off: w.rng.Int64N(int64(time.Hour))}
	p := &Pool{cfg: pc, conf: conf, log: slogDiscard(), observed: true,
		peers: map[string]*peer{}, draining: map[string]*peer{},
		budget: newRetryBudget(pc.RetryRatio, pc.RetryMinPerS), throttle: newThrottler(pc.Throttle),
		clk: v.clk, hostOff: w.hostNS - v.clk.off, hasSRV: sp.srv, ctx: w.deadCtx, cancel: func() {}}
	if sp.srv {
		p.targets = []target{{host: "_q._udp.sim.test", srv: true}}
	} else {
		p.targets = []target{{host: "svc.sim.test", port: "8443"}}
	}
	if p.throttle != nil {
		p.throttle.rnd = w.rng.Float64
	}
	p.set.Store(&peerSet{})
	v.p = p
	p.Share(ShareConfig{Slot: slot, Slots: sp.slots, Notify: func() bool { v.wantStep.Store(true); return true }})
	sp.period = p.LeasePeriod()
	sp.views = append(sp.views, v)
	sp.lastDisturb = w.now
	// DialPool: its own resolution, then every server joins.
	v.resolveWith(sp.dns)
	w.tracef("join %v", v)
	v.schedule()
	return v
}

// seed gives the view a draining peer for every address it lacks, for
// apply to take back (see the top of the file).
func (v *simView) seed() {
	p := v.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range v.sp.w.servers {
		if p.peers[s.addr] != nil || p.draining[s.addr] != nil {
			continue
		}
		v.seedOne(s, s.target)
	}
}

// seedOne adds a draining peer of s under TLS name name. Called with
// p.mu held.
func (v *simView) seedOne(s *simServer, name string) *peer {
	p := v.p
	pr := newPeer(p, s.addr)
	if !v.sp.srv {
		name = "svc.sim.test"
	}
	pr.name = name
	pr.h.Store(&health{ejectFor: int64(p.cfg.Eject), draining: true})
	pr.c = v.sp.w.newBackend(s, pr)
	p.draining[s.addr] = pr
	v.seeded[pr] = true
	v.all = append(v.all, pr)
	pr.refresh()
	return pr
}

// settle waits for the drain goroutines apply started, and forgets the
// seeds apply took.
func (v *simView) settle() {
	p := v.p
	p.wg.Wait()
	for pr := range v.seeded {
		if !pr.h.Load().draining {
			delete(v.seeded, pr)
		}
	}
}

// resolveWith is the view's re-resolution finding list (resolveLoop).
func (v *simView) resolveWith(list []Resolved) {
	v.seed()
	want, names, meta := resolvedArgs(list)
	p := v.p
	p.mu.Lock()
	p.noteResolved(want, names, meta)
	_ = p.apply(want, names, meta)
	p.mu.Unlock()
	v.settle()
}

// schedule starts the view's periodic work: lease ticks, checks,
// re-resolution.
func (v *simView) schedule() {
	w, p := v.sp.w, v.p
	if per := v.sp.period; per > 0 {
		var tick func()
		tick = func() {
			if v.gone {
				return
			}
			v.requestStep(0)
			w.after(per, "lease tick", tick)
		}
		w.after(w.dur(0, per), "lease tick", tick)
	}
	if iv := p.cfg.Check.Interval; p.cfg.Check.Method != "" && iv > 0 {
		var check func()
		check = func() {
			if v.gone {
				return
			}
			if !p.share.noProbe.Load() {
				w.tracef("check %v", v)
				p.ctx = w.liveCtx
				for _, pr := range p.set.Load().peers {
					p.check(pr)
				}
				p.ctx = w.deadCtx
			}
			w.after(iv, "check", check)
		}
		w.after(w.dur(0, iv), "check", check)
	}
	if iv := p.cfg.Resolve; iv > 0 {
		var resolve func()
		resolve = func() {
			if v.gone {
				return
			}
			if !p.share.noResolve.Load() {
				w.tracef("resolve %v (%d addrs)", v, len(v.sp.dns))
				v.resolveWith(v.sp.dns)
			}
			w.after(iv, "resolve", resolve)
		}
		w.after(w.dur(0, iv), "resolve", resolve)
	}
}

// requestStep asks for a step of the view after d.
func (v *simView) requestStep(d time.Duration) {
	if v.gone || v.stepSoon {
		return
	}
	v.stepSoon = true
	v.sp.w.after(d, "step", func() {
		v.stepSoon = false
		v.beginStep(ShareStep)
	})
}

// beginStep starts a step; its rounds are events of their own.
func (v *simView) beginStep(mode int) {
	if v.gone {
		return
	}
	if v.stepping {
		v.again = true
		return
	}
	w := v.sp.w
	v.stepping = true
	v.reach = map[*peer]int64{}
	v.reachEvs = w.store.evicted
	if mode == ShareStep {
		for _, pr := range v.p.set.Load().peers {
			// A view whose own change is on its way out refuses the
			// verdict; it publishes its change instead (a newer
			// generation), or, when it keeps that change to itself (the
			// last server up lifted here), takes the verdict at its
			// next step: not checked.
			if g := w.peekNum(v.sp.prefix + "g:" + pr.addr); g > 0 && !pr.h.Load().dirty() &&
				w.peek(v.sp.prefix+"c:"+pr.addr+":"+strconv.FormatInt(g, 10)) != nil {
				v.reach[pr] = g
			}
		}
	}
	// The first round handed out with the last step's answer runs now,
	// and goes with the step (one exchange for an idle step); now and
	// then a host that lost it (a new worker, a reload) steps without.
	var pre []StoreResult
	if mode == ShareStep && v.pre != nil && w.rng.IntN(8) != 0 {
		pre = w.runOps(v, v.pre)
	}
	v.pre = nil
	v.seed()
	ops, more := v.p.ShareStep(mode, pre)
	if !more && mode == ShareStep {
		v.pre = v.p.ShareNext()
	}
	v.settle()
	v.round(ops, more, mode)
}

func (v *simView) round(ops []StoreOp, more bool, mode int) {
	w := v.sp.w
	res := w.runOps(v, ops)
	if !more {
		v.stepping = false
		v.stepDone(mode)
		return
	}
	w.after(w.dur(0, 200*time.Microsecond), "step round", func() {
		if v.gone {
			v.stepping = false
			return
		}
		v.seed()
		ops, more := v.p.ShareStep(0, res)
		if !more {
			v.pre = v.p.ShareNext()
		}
		v.settle()
		v.round(ops, more, mode)
	})
}

// stepDone checks that the verdicts in the store when the step began
// reached the view, and starts the step asked for meanwhile.
func (v *simView) stepDone(mode int) {
	w := v.sp.w
	if mode == ShareExit {
		v.gone = true
		v.sp.lastDisturb = w.now
		w.tracef("exited %v", v)
		return
	}
	if w.store.evicted == v.reachEvs {
		for pr, g := range v.reach {
			if h := pr.h.Load(); int64(h.gen) < g {
				w.failf("%v: a verdict of %s (generation %d) did not reach the view in its step (it has %d; health %+v)", v, pr.addr, g, h.gen, *h)
			}
		}
	}
	w.tracef("stepped %v probe=%v resolve=%v", v, !v.p.share.noProbe.Load(), !v.p.share.noResolve.Load())
	if v.exitNext {
		v.exitNext = false
		v.beginStep(ShareExit)
		return
	}
	if v.again {
		v.again = false
		v.requestStep(0)
	}
}

func (w *simWorld) peek(key string) []byte {
	it := w.store.m[key]
	if it == nil || it.exp != 0 && w.now >= it.exp {
		return nil
	}
	if it.isN {
		return []byte(strconv.FormatFloat(it.num, 'f', 0, 64))
	}
	return it.val
}

func (w *simWorld) peekNum(key string) int64 { return num(w.peek(key)) }

// simKeyForms are the keys a pool may name (pool_share.go).
var simKeyForms = []string{"g:", "c:", "f:", "t:", "tr:", "ta:"}

// runOps runs a step's ops on the store, checking that the view names
// only keys of its own pool's forms and reads only what its pool wrote.
func (w *simWorld) runOps(v *simView, ops []StoreOp) []StoreResult {
	prefix := v.sp.prefix
	for _, op := range ops {
		scope := v.p.listScope()
		ok := op.Key == "v" || slices.Contains([]string{"lp", "ld", "rg", "rl"}, strings.TrimSuffix(op.Key, scope))
		for _, f := range simKeyForms {
			ok = ok || strings.HasPrefix(op.Key, f)
		}
		if !ok {
			w.failf("%v: a store op on an unknown key %q", v, op.Key)
		}
		full := prefix + op.Key
		if op.Kind == OpGet {
			if who, ok := w.writer[full]; ok && who != v.sp.name && w.peek(full) != nil {
				w.failf("%v read %q, written by pool %s", v, full, who)
			}
			continue
		}
		w.writer[full] = v.sp.name
	}
	res := w.store.run(prefix, ops)
	if w.trace {
		var b strings.Builder
		for i, op := range ops {
			fmt.Fprintf(&b, " %d:%s=%q/%v/%d", op.Kind, op.Key, res[i].Value, res[i].OK, res[i].N)
		}
		w.tb.Logf("ops of %v:%s", v, b.String())
	}
	if len(w.store.noTTL) > 0 {
		w.failf("keys written without a TTL: %v", w.store.noTTL)
	}
	return res
}

// ---- calls ---------------------------------------------------------------

type simCall struct {
	id        uint64
	v         *simView
	limit     int
	sends     int
	done      int
	attempts  int
	cancelled bool
	startErr  bool
	err       error
	pend      Pending
}

// simCallOpts shape one call.
type simCallOpts struct {
	deadline time.Duration
	retries  int
	hedge    Hedge
	key      []byte
}

// startCall starts a call on view v; it returns the call (its error in
// startErr).
func (w *simWorld) startCall(v *simView, o simCallOpts) *simCall {
	p := v.p
	c := &simCall{id: uint64(len(w.calls)), v: v}
	w.calls = append(w.calls, c)
	retries := p.cfg.Retries
	if o.retries != 0 {
		retries = min(max(o.retries, 0), MaxRetries)
	}
	hedge := p.cfg.Hedge
	if o.hedge.Max != 0 {
		hedge = o.hedge
		hedge.Max = min(max(hedge.Max, 0), MaxHedge)
	}
	c.limit = 1 + retries + hedge.Max
	body := binary.LittleEndian.AppendUint64(nil, c.id)
	call := &Call{Method: []byte("sim.M"), Body: body, HashKey: o.key, Retries: o.retries, Hedge: o.hedge}
	if o.deadline > 0 {
		call.Deadline = v.clk.Now().Add(o.deadline)
	}
	w.open++
	pend, err := p.StartAttempts(call, func(resp *Response, n int, err error) {
		c.done++
		c.attempts, c.err = n, err
		switch {
		case c.done > 1:
			w.failf("call %d: done ran %d times", c.id, c.done)
		case c.cancelled:
			w.failf("call %d: done ran after a cancel that reported the call pending", c.id)
		case n > c.limit || n != c.sends:
			w.failf("call %d: %d attempts reported, %d sent, at most %d", c.id, n, c.sends, c.limit)
		}
		if c.done == 1 {
			w.open--
		}
		code := -1
		if resp != nil {
			code = int(resp.Code)
		}
		w.tracef("done %d on %v: code %d attempts %d err %v", c.id, v, code, n, simErrWord(err))
	})
	if err != nil {
		c.startErr = true
		w.open--
		if c.sends != 0 {
			w.failf("call %d: refused at start (%v) after %d sends", c.id, err, c.sends)
		}
		w.tracef("refused %d on %v: %v", c.id, v, simErrWord(err))
		return c
	}
	c.pend = pend
	w.tracef("start %d on %v", c.id, v)
	return c
}

func (w *simWorld) cancelCall(c *simCall) {
	if c.startErr {
		return
	}
	ok := c.pend.Cancel()
	switch {
	case ok && c.done > 0:
		w.failf("call %d: cancel reported it pending after its done", c.id)
	case ok:
		c.cancelled = true
		w.open--
	case c.done == 0 && !c.cancelled:
		w.failf("call %d: cancel reported it over, and its done has not run", c.id)
	}
	w.tracef("cancel %d: %v", c.id, ok)
}

// simErrWord is an error's kind, for the trace (no addresses: the trace
// must not depend on anything but the seed).
func simErrWord(err error) string {
	for _, e := range []error{ErrThrottled, ErrNoServer, ErrTimeout, ErrConnLost, ErrUnavailable, ErrClosed, context.Canceled} {
		if errors.Is(err, e) {
			s := e.Error()
			var ae *AttemptsError
			if errors.As(err, &ae) && ae.Budget {
				s += " (budget)"
			}
			return s
		}
	}
	if err == nil {
		return "nil"
	}
	return "other: " + err.Error()
}

// ---- after every event -----------------------------------------------------

func (w *simWorld) afterEvent(label string) {
	w.panicMu.Lock()
	if len(w.panics) > 0 {
		w.failf("recovered panic: %s", w.panics[0])
	}
	w.panicMu.Unlock()
	if w.store.evicted != w.evicted {
		w.evicted = w.store.evicted
		for _, sp := range w.pools {
			sp.lastDisturb = w.now
		}
	}
	d := fnv.New64a()
	for _, sp := range w.pools {
		for _, v := range sp.views {
			w.checkView(v, d)
		}
		w.checkLeases(sp)
	}
	w.tracef("%s: state %x", label, d.Sum64())
}

// checkView runs a drain that is due, asks for the step the view was
// notified for, and checks the view's servers.
func (w *simWorld) checkView(v *simView, d hash.Hash64) {
	p := v.p
	if p == nil {
		return
	}
	if v.wantStep.Swap(false) {
		v.requestStep(w.dur(0, 2*time.Millisecond))
	}
	p.mu.Lock()
	var idle []*peer
	for _, pr := range p.draining {
		if !v.seeded[pr] && pr.h.Load().draining && pr.inflight.Load() == 0 {
			idle = append(idle, pr)
		}
	}
	p.mu.Unlock()
	slices.SortFunc(idle, func(a, b *peer) int { return strings.Compare(a.addr, b.addr) })
	for _, pr := range idle {
		p.drain(pr)
		w.tracef("drained %s from %v", pr.addr, v)
	}
	setPtr := p.set.Load()
	set := setPtr.peers
	now := monoNS(v.clk.Now())
	limit := maxEjectFactor * int64(p.cfg.Eject)
	// A membership change that took out a server taking calls at the last
	// check: the last-server-up rule holds after it too.
	lostUp := false
	if setPtr != v.prevSetPtr && v.prevSetPtr != nil {
		for _, o := range v.prevSetPtr.peers {
			if v.took[o] && !slices.Contains(set, o) {
				lostUp = true
			}
		}
	}
	for _, pr := range set {
		h := pr.h.Load()
		if h.until != 0 && h.until-now > limit || h.ejectFor > limit {
			w.failf("%v: %s ejected for %v (until +%v), more than 10 × %v", v, pr.addr,
				time.Duration(h.ejectFor), time.Duration(h.until-now), p.cfg.Eject)
		}
		if h.ejected() && pr.c.up() && (!v.ejected[pr] || lostUp) {
			// A new ejection, or a membership change that took out the
			// server up that allowed an ejection earlier.
			up := false
			for _, o := range set {
				if oh := o.h.Load(); o != pr && !oh.ejected() && !oh.draining && o.c.up() {
					up = true
				}
			}
			if !up {
				var b strings.Builder
				for _, o := range set {
					oh := o.h.Load()
					fmt.Fprintf(&b, " %s(ejected %v, draining %v, up %v)", o.addr, oh.ejected(), oh.draining, o.c.up())
				}
				p.mu.Lock()
				for a, o := range p.draining {
					fmt.Fprintf(&b, " draining %s(seed %v, up %v)", a, v.seeded[o], o.c.up())
				}
				p.mu.Unlock()
				w.tracef("set:%s", b.String())
				w.failf("%v: %s ejected with no other server up (the last server up is ejected): %+v", v, pr.addr, *h)
			}
		}
		v.ejected[pr] = h.ejected()
		fmt.Fprintf(d, "%s %d %d %d %d %v;", pr.addr, h.until, h.fails, h.gen, pr.inflight.Load(), h.trial != 0)
	}
	clear(v.took)
	for _, pr := range set {
		v.took[pr] = pr.takes()
	}
	v.prevSetPtr = setPtr
	fmt.Fprintf(d, "|%d|", p.inflight.Load())
}

// checkLeases: once nothing disturbed the leases for long enough, at most
// one view of a pool probes, and one resolves.
func (w *simWorld) checkLeases(sp *simPool) {
	if sp.period <= 0 || w.now-sp.lastDisturb < 4*int64(sp.period) {
		return
	}
	probes, resolvers := 0, 0
	for _, v := range sp.views {
		if v.gone || v.p == nil {
			continue
		}
		if !v.p.share.noProbe.Load() {
			probes++
		}
		if !v.p.share.noResolve.Load() {
			resolvers++
		}
	}
	checks := sp.cfg.Check.Method != ""
	if checks && probes > 1 || resolvers > 1 {
		w.failf("pool %s: %d views probe and %d resolve, %v after the leases were last disturbed",
			sp.name, probes, resolvers, time.Duration(w.now-sp.lastDisturb))
	}
}

// checkDrained: with no call open, nothing is in flight anywhere and the
// observer's gauges say what the servers are.
func (w *simWorld) checkDrained() {
	for _, c := range w.calls {
		if !c.startErr && c.done+b2i(c.cancelled) != 1 {
			w.failf("call %d: done %d times, cancelled %v", c.id, c.done, c.cancelled)
		}
	}
	for _, sp := range w.pools {
		for _, v := range sp.views {
			if v.p == nil {
				continue
			}
			if n := v.p.inflight.Load(); n != 0 {
				w.failf("%v: %d calls in flight on the pool after the drain", v, n)
			}
			for _, pr := range v.all {
				if n := pr.inflight.Load(); n != 0 {
					w.failf("%v: %d calls in flight on %s after the drain", v, n, pr.addr)
				}
				po := pr.obs.(*simPeerObs)
				if n := po.inflight.Load(); n != 0 {
					w.failf("%v: the in-flight gauge of %s is %d after the drain", v, pr.addr, n)
				}
				if s := observe.PeerState(po.state.Load()); s != pr.compute() {
					w.failf("%v: %s reported %v, is %v", v, pr.addr, s, pr.compute())
				}
			}
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ---- a random run ------------------------------------------------------------

// simRun is one seeded run: two pools of random configurations (different
// prefixes, the same servers) of 1 to 4 views each, random calls and
// faults.
func simRun(tb testing.TB, seed uint64, steps int, walls bool) *simWorld {
	w := newSimWorld(tb, seed, simKnobs{})
	r := w.rng
	w.walls = walls
	w.knobs = simKnobs{refusePct: r.IntN(3), lossPermil: r.IntN(20), faultEvery: int64(w.dur(20*time.Millisecond, 150*time.Millisecond)),
		arriveEvery: int64(w.dur(time.Millisecond, 4*time.Millisecond)), dnsChanges: r.IntN(4) != 0, exits: r.IntN(3) != 0}
	if r.IntN(3) == 0 {
		w.knobs.storeMax = 25 + r.IntN(30)
		w.store.max = w.knobs.storeMax
	}
	w.addServers(2+r.IntN(4), map[int]bool{1: r.IntN(2) == 0})
	safego.SetReporter(func(where string, v any, stack []byte) {
		w.panicMu.Lock()
		w.panics = append(w.panics, fmt.Sprintf("%s: %v\n%s", where, v, stack))
		w.panicMu.Unlock()
	})
	defer safego.SetReporter(nil)
	for i, name := range []string{"pa", "pb"} {
		bal := Balance((seed + uint64(i)) % 4)
		w.newPool(name, w.randomConfig(bal), r.IntN(2) == 0, 1+r.IntN(4))
	}
	w.tracef("seed %d: %d servers, knobs %+v", seed, len(w.servers), w.knobs)
	w.after(w.exp(w.knobs.arriveEvery), "arrive", w.arrive)
	w.after(w.exp(w.knobs.faultEvery), "fault", w.fault)
	for w.events < steps && w.failure == "" && w.step() {
	}
	w.drain()
	if w.failure == "" {
		w.checkDrained()
	}
	return w
}

func (w *simWorld) randomConfig(bal Balance) PoolConfig {
	r := w.rng
	cfg := PoolConfig{Balance: bal, Failures: 1 + r.IntN(3), Eject: w.dur(100*time.Millisecond, 2*time.Second),
		Retries: r.IntN(3), Resolve: w.dur(100*time.Millisecond, time.Second)}
	switch r.IntN(3) {
	case 0:
		cfg.Stall = -1
	case 1:
		cfg.Stall = w.dur(20*time.Millisecond, 100*time.Millisecond)
	}
	if r.IntN(4) != 0 {
		cfg.Check = HealthCheck{Method: "sim.Check", Interval: w.dur(50*time.Millisecond, 600*time.Millisecond)}
	}
	if r.IntN(3) == 0 {
		cfg.TryTimeout = w.dur(10*time.Millisecond, 100*time.Millisecond)
	}
	switch r.IntN(4) {
	case 0:
		cfg.Hedge = Hedge{Max: 1 + r.IntN(MaxHedge), Delay: w.dur(time.Millisecond, 20*time.Millisecond)}
	case 1:
		cfg.Hedge = Hedge{Max: 1, P95: true}
	}
	if r.IntN(3) == 0 {
		cfg.RetryRatio, cfg.RetryMinPerS = -1, 1+r.IntN(3)
	}
	if r.IntN(4) == 0 {
		cfg.EjectOn = FailTimeout | FailConnect
	}
	if r.IntN(3) == 0 {
		cfg.Throttle = Throttle{K: 1.5 + r.Float64(), Codes: []uint32{7}}
	}
	return cfg
}

// arrive starts a call on a random view (now and then an event), with a
// random deadline, options, and perhaps a caller that gives up.
func (w *simWorld) arrive() {
	if w.stopped {
		return
	}
	defer w.after(w.exp(w.knobs.arriveEvery), "arrive", w.arrive)
	r := w.rng
	sp := w.pools[r.IntN(len(w.pools))]
	var live []*simView
	for _, v := range sp.views {
		if !v.gone && !v.exiting && v.p != nil {
			live = append(live, v)
		}
	}
	if len(live) == 0 {
		return
	}
	v := live[r.IntN(len(live))]
	if r.IntN(20) == 0 {
		err := v.p.SendEvent(&Call{Method: []byte("sim.E"), HashKey: []byte{byte(r.IntN(16))}})
		w.tracef("event on %v: %v", v, simErrWord(err))
		return
	}
	o := simCallOpts{deadline: w.dur(10*time.Millisecond, 800*time.Millisecond)}
	if sp.cfg.Balance == Hash && r.IntN(4) != 0 {
		o.key = []byte("k" + strconv.Itoa(r.IntN(16)))
	}
	switch r.IntN(10) {
	case 0:
		o.retries = r.IntN(MaxRetries+2) - 1
	case 1:
		o.hedge = Hedge{Max: r.IntN(MaxHedge+2) - 1, Delay: w.dur(time.Millisecond, 10*time.Millisecond)}
	}
	c := w.startCall(v, o)
	switch r.IntN(10) {
	case 0: // a caller that gives up early
		w.after(w.dur(0, o.deadline), "give up", func() { w.cancelCall(c) })
	case 1, 2: // Unary's context, at the deadline itself
		w.after(o.deadline, "deadline", func() { w.cancelCall(c) })
	}
	// a step on the call path, when the view finds the version moved
	if r.IntN(8) == 0 {
		v.requestStep(0)
	}
}

// fault injects one fault.
func (w *simWorld) fault() {
	if w.stopped {
		return
	}
	defer w.after(w.exp(w.knobs.faultEvery), "fault", w.fault)
	r := w.rng
	s := w.servers[r.IntN(len(w.servers))]
	switch k := r.IntN(12); k {
	case 0, 1:
		if s.dead {
			break
		}
		s.dead = true
		s.epoch++
		w.tracef("kill %s", s.addr)
		for _, b := range s.backends {
			w.after(w.dur(0, 30*time.Millisecond), "lost", b.lose)
		}
		w.after(w.dur(50*time.Millisecond, 2*time.Second), "restart", func() {
			s.dead = false
			w.tracef("restart %s", s.addr)
		})
	case 2:
		s.frozen = true
		w.tracef("freeze %s", s.addr)
		w.after(w.dur(20*time.Millisecond, time.Second), "thaw", func() { s.frozen = false; w.tracef("thaw %s", s.addr) })
	case 3:
		s.fastFail = true
		w.tracef("fail fast %s", s.addr)
		w.after(w.dur(20*time.Millisecond, time.Second), "heal", func() { s.fastFail = false; w.tracef("heal %s", s.addr) })
	case 4:
		s.slow = w.dur(20*time.Millisecond, 300*time.Millisecond)
		w.tracef("slow %s", s.addr)
		w.after(w.dur(50*time.Millisecond, time.Second), "fast", func() { s.slow = 0 })
	case 5:
		s.overload = !s.overload
		w.tracef("overload %s %v", s.addr, s.overload)
	case 6, 7:
		if !w.knobs.dnsChanges {
			break
		}
		sp := w.pools[r.IntN(len(w.pools))]
		targets := map[string]bool{}
		prio, weight := map[string]uint16{}, map[string]uint16{}
		for _, s := range w.servers {
			if r.IntN(3) != 0 {
				targets[s.target] = true
			}
			prio[s.target] = uint16(10 * r.IntN(2))
			weight[s.target] = uint16(r.IntN(4))
		}
		if len(targets) == 0 {
			targets[s.target] = true
		}
		sp.dns = sp.dnsList(targets, prio, weight)
		w.tracef("dns %s: %d addrs", sp.name, len(sp.dns))
	case 8:
		// a step of the wall clock, either way: no window may move
		sec := int64(r.IntN(7200)) - 3600
		if w.walls {
			w.wall += sec
		}
		w.tracef("wall clock step")
	case 9, 10:
		if !w.knobs.exits {
			break
		}
		sp := w.pools[r.IntN(len(w.pools))]
		var live []*simView
		for _, v := range sp.views {
			if !v.gone && !v.exiting {
				live = append(live, v)
			}
		}
		if len(live) == 0 {
			break
		}
		v := live[r.IntN(len(live))]
		sp.lastDisturb = w.now
		if k == 9 {
			// a graceful exit, a lease or not: the leases go at once
			v.exiting = true
			w.tracef("exit %v", v)
			if v.stepping {
				v.exitNext = true
			} else {
				v.beginStep(ShareExit)
			}
		} else {
			// a crash: its leases lapse
			v.gone = true
			w.tracef("crash %v", v)
		}
		w.after(w.dur(10*time.Millisecond, 500*time.Millisecond), "rejoin", func() {
			if !w.stopped {
				sp.addView(v.slot)
			}
		})
	}
}
