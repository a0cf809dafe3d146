package qrpc

import (
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

// runSeeds runs the simulation for each seed, steps events each, and
// fails with the seed's replay command.
func runSeeds(t *testing.T, seeds []uint64, steps int) {
	t.Helper()
	if *simSeed != 0 {
		seeds = []uint64{*simSeed}
	}
	if *simSteps != 0 {
		steps = *simSteps
	}
	began := time.Now()
	total := 0
	for _, seed := range seeds {
		w := simRun(t, seed, steps, true)
		total += w.events
		if w.failure != "" {
			t.Fatalf("seed %d failed after %d events: %s\nlast events:\n  %s\nreplay: %s",
				seed, w.events, w.failure, strings.Join(w.recent, "\n  "), w.replay(steps))
		}
		if len(seeds) <= 30 {
			t.Logf("seed %d: %d events, %d calls, trace %x", seed, w.events, len(w.calls), w.h.Sum64())
		}
	}
	el := time.Since(began)
	t.Logf("%d seeds, %d events in %v (%.0f events/s)", len(seeds), total, el.Round(time.Millisecond), float64(total)/el.Seconds())
}

func seedRange(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

// TestPoolSimulation runs the pool simulation (poolsim_test.go): 25
// seeds × 2,000 events, every invariant checked after every event. A
// failure prints the seed and the command that replays it.
func TestPoolSimulation(t *testing.T) {
	runSeeds(t, seedRange(1, 25), 2000)
}

// TestPoolSimulationLong: 200 more seeds × 10,000 events (make
// test-long).
func TestPoolSimulationLong(t *testing.T) {
	ngxtest.Long(t, "2,000,000 simulated events")
	runSeeds(t, seedRange(1000, 200), 10000)
}

// TestPoolSimulationReplays: a seed replays exactly (the same trace, event
// by event), and a run whose wall clock steps by up to an hour either way
// traces as one whose clock does not: no window is on the wall clock.
func TestPoolSimulationReplays(t *testing.T) {
	stepped := 0
	for seed := uint64(1); seed <= 40 && stepped < 4; seed++ {
		a := simRun(t, seed, 3000, true)
		if a.failure != "" {
			t.Fatalf("seed %d: %s", seed, a.failure)
		}
		if a.wall == 0 {
			continue // a run whose draws held no wall clock step
		}
		stepped++
		b := simRun(t, seed, 3000, true)
		c := simRun(t, seed, 3000, false)
		if a.h.Sum64() != b.h.Sum64() {
			t.Fatalf("seed %d: two runs traced %x and %x", seed, a.h.Sum64(), b.h.Sum64())
		}
		if a.h.Sum64() != c.h.Sum64() {
			t.Fatalf("seed %d: a run whose wall clock stepped (by %d s in all) traced %x, one whose clock did not %x", seed, a.wall, a.h.Sum64(), c.h.Sum64())
		}
	}
	if stepped < 4 {
		t.Fatalf("only %d of 40 seeds stepped the wall clock", stepped)
	}
}

// ---- named scenarios: the pool bugs that live in Go ---------------------

// simSmall is a world of n servers (dual: the indices whose target has a
// second, IPv6 address) and one pool of views views, connected.
func simSmall(t *testing.T, n int, dual map[int]bool, cfg PoolConfig, srv bool, views int) (*simWorld, *simPool) {
	t.Helper()
	w := newSimWorld(t, 42, simKnobs{})
	w.addServers(n, dual)
	sp := w.newPool("pa", cfg, srv, views)
	w.runFor(10 * time.Millisecond)
	return w, sp
}

// setDNS makes list the pool's name's answer and every view's servers.
func (sp *simPool) setDNS(list []Resolved) {
	sp.dns = list
	for _, v := range sp.views {
		if !v.gone {
			v.resolveWith(list)
		}
	}
}

// call runs one call on v to its end.
func (w *simWorld) call(v *simView, o simCallOpts) *simCall {
	if o.deadline == 0 {
		o.deadline = time.Second
	}
	c := w.startCall(v, o)
	end := w.now + int64(o.deadline) + int64(time.Millisecond)
	for w.failure == "" && !c.startErr && c.done == 0 && !c.cancelled && w.now < end && w.step() {
	}
	return c
}

func (w *simWorld) mustOK(t *testing.T) {
	t.Helper()
	if w.failure != "" {
		t.Fatalf("%s\nlast events:\n  %s", w.failure, strings.Join(w.recent, "\n  "))
	}
}

// stallElsewhere writes another view's stall verdict on addr into the
// store, and steps v so that it reads it.
func (w *simWorld) stallElsewhere(v *simView, addr string) {
	w.store.run(v.sp.prefix, []StoreOp{{Kind: OpSet, Key: "t:" + addr, Value: []byte("another-view"), TTL: shareStallTTL}})
	v.beginStep(ShareStep)
	w.runFor(time.Millisecond)
}

// TestSimSRVP2COneServerPerTier: p2c over an SRV name with one target per
// priority answers (it divided by zero: a panic on every call).
func TestSimSRVP2COneServerPerTier(t *testing.T) {
	w, sp := simSmall(t, 2, nil, PoolConfig{Balance: P2C, Stall: -1}, true, 1)
	sp.setDNS(sp.dnsList(map[string]bool{"t0.sim.test": true, "t1.sim.test": true},
		map[string]uint16{"t0.sim.test": 0, "t1.sim.test": 10}, map[string]uint16{"t0.sim.test": 1, "t1.sim.test": 1}))
	for range 50 {
		if c := w.call(sp.views[0], simCallOpts{}); c.err != nil || c.done != 1 {
			t.Fatalf("call %d: %v (done %d)", c.id, c.err, c.done)
		}
		w.mustOK(t)
	}
	if w.servers[1].hits != 0 {
		t.Fatalf("the second tier took %d calls with the first up", w.servers[1].hits)
	}
}

// TestSimRemoteStallEveryBalancer: a server another view saw stalled
// takes no call of this view while another server can, whatever the
// balancer; with every server stalled elsewhere, calls still go out.
func TestSimRemoteStallEveryBalancer(t *testing.T) {
	for b := RoundRobin; b <= P2C; b++ {
		t.Run(b.String(), func(t *testing.T) {
			w, sp := simSmall(t, 3, nil, PoolConfig{Balance: b}, false, 2)
			v := sp.views[0]
			stalled := w.servers[0]
			for i := range 60 {
				if i%20 == 0 {
					w.stallElsewhere(v, stalled.addr)
				}
				if c := w.call(v, simCallOpts{key: []byte("k" + strconv.Itoa(i))}); c.err != nil {
					t.Fatalf("call %d: %v", i, c.err)
				}
			}
			if stalled.hits != 0 {
				t.Fatalf("%s, stalled in another view, took %d of 60 calls", stalled.addr, stalled.hits)
			}
			for i := range 30 {
				if i%10 == 0 {
					for _, s := range w.servers {
						w.stallElsewhere(v, s.addr)
					}
				}
				if c := w.call(v, simCallOpts{key: []byte("k" + strconv.Itoa(i))}); c.err != nil {
					t.Fatalf("every server stalled elsewhere: call %d: %v", i, c.err)
				}
			}
			w.mustOK(t)
		})
	}
}

// TestSimNewResolverPublishes: a view that becomes the resolver again
// publishes its list, though it is the one it published when it last
// held the lease (the others hold another one meanwhile).
func TestSimNewResolverPublishes(t *testing.T) {
	w, sp := simSmall(t, 3, nil, PoolConfig{Resolve: 200 * time.Millisecond, Stall: -1}, false, 2)
	v, o := sp.views[0], sp.views[1]
	l0 := sp.dns
	l1 := sp.dnsList(map[string]bool{"t0.sim.test": true, "t1.sim.test": true}, nil, nil)
	// take makes x the resolver: the lease key goes (evicted, say), x
	// steps first.
	take := func(x *simView) {
		w.store.run(sp.prefix, []StoreOp{{Kind: OpDelete, Key: "ld" + x.p.listScope()}})
		sp.lastDisturb = w.now
		x.beginStep(ShareStep)
		w.runFor(time.Second)
		w.mustOK(t)
		if x.p.share.noResolve.Load() {
			t.Fatalf("%v did not take the lease", x)
		}
	}
	take(v) // v publishes l0
	take(o)
	sp.dns = l1
	w.runFor(time.Second) // o publishes l1, v takes it
	if n := len(v.p.set.Load().peers); n != 2 {
		t.Fatalf("%v has %d servers after the resolver found 2", v, n)
	}
	sp.dns = l0
	take(v) // v resolves l0 again: what it published last time
	w.runFor(time.Second)
	w.mustOK(t)
	if n := len(o.p.set.Load().peers); n != 3 {
		t.Fatalf("%v has %d servers, 3 after the new resolver (%v) resolved them", o, n, v)
	}
}

// TestSimStaleTrial: a trial call in flight when a check brings its
// server back is stale: its failure is an ordinary one, and the last
// server up (the other is down by then) is not ejected by it.
func TestSimStaleTrial(t *testing.T) {
	cfg := PoolConfig{Failures: 1, Eject: 100 * time.Millisecond, Stall: -1}
	w, sp := simSmall(t, 2, nil, cfg, false, 1)
	v, p := sp.views[0], sp.views[0].p
	a, b := w.servers[0], w.servers[1]
	pa := p.peers[a.addr]
	p.outcome(pa, 0, errTimeoutForTest())
	if !pa.h.Load().ejected() {
		t.Fatal("no ejection")
	}
	a.frozen = true
	w.runFor(150 * time.Millisecond)
	var trial *simCall
	for range 10 {
		trial = w.startCall(v, simCallOpts{deadline: 500 * time.Millisecond})
		if pa.h.Load().trial != 0 {
			break
		}
		w.runFor(10 * time.Millisecond)
	}
	if pa.h.Load().trial == 0 {
		t.Fatal("no trial call went to the server")
	}
	// A check answers: the server is back, the trial's token void.
	a.frozen = false
	p.ctx = w.liveCtx
	p.check(pa)
	p.ctx = w.deadCtx
	if h := pa.h.Load(); h.ejected() || h.trial != 0 {
		t.Fatalf("after a good check: %+v", *h)
	}
	// The other server goes; then the trial (sent while the server was
	// frozen) times out.
	b.dead = true
	b.epoch++
	for _, bk := range b.backends {
		bk.lose()
	}
	w.runFor(600 * time.Millisecond)
	w.mustOK(t)
	if trial.done != 1 || !errors.Is(trial.err, ErrTimeout) {
		t.Fatalf("the trial call: done %d, %v", trial.done, trial.err)
	}
	if pa.h.Load().ejected() {
		t.Fatalf("the stale trial's failure ejected the last server up: %+v", *pa.h.Load())
	}
}

// TestSimStaleBack: another view's "back", older than this view's own
// ejection, does not undo it, in a step or replayed.
func TestSimStaleBack(t *testing.T) {
	cfg := PoolConfig{Failures: 2, Eject: 10 * time.Second, Stall: -1}
	w, sp := simSmall(t, 2, nil, cfg, false, 2)
	v1, v2 := sp.views[0], sp.views[1]
	addr := w.servers[0].addr
	// View 2 publishes a verdict "back" (an ejection a check ended).
	p2a := v2.p.peers[addr]
	v2.p.outcome(p2a, 0, errTimeoutForTest())
	v2.p.outcome(p2a, 0, errTimeoutForTest())
	v2.p.transition(p2a, event{kind: evCheckOK})
	v2.beginStep(ShareStep)
	w.runFor(time.Millisecond)
	if g := w.peekNum(sp.prefix + "g:" + addr); g == 0 {
		t.Fatal("view 2 published nothing")
	}
	// View 1 ejects the server, then steps: it reads view 2's older
	// "back" before publishing its own ejection.
	p1a := v1.p.peers[addr]
	v1.p.outcome(p1a, 0, errTimeoutForTest())
	v1.p.outcome(p1a, 0, errTimeoutForTest())
	if !p1a.h.Load().ejected() {
		t.Fatal("no ejection in view 1")
	}
	old := uint64(w.peekNum(sp.prefix + "g:" + addr))
	v1.beginStep(ShareStep)
	w.runFor(time.Millisecond)
	w.mustOK(t)
	h := p1a.h.Load()
	if !h.ejected() {
		t.Fatalf("view 2's older back undid view 1's ejection: %+v", *h)
	}
	v1.p.transition(p1a, event{kind: evImport, gen: old, eject: false})
	if !p1a.h.Load().ejected() {
		t.Fatalf("a back of generation %d, replayed, undid an ejection of generation %d", old, h.gen)
	}
}

// TestSimP2CFastFailure: p2c does not send most calls to a server that
// fails every call at once (its failures not counted by health.on).
func TestSimP2CFastFailure(t *testing.T) {
	cfg := PoolConfig{Balance: P2C, EjectOn: FailTimeout, Stall: -1}
	w, sp := simSmall(t, 2, nil, cfg, false, 1)
	bad := w.servers[0]
	bad.fastFail = true
	for range 400 {
		w.call(sp.views[0], simCallOpts{})
	}
	w.mustOK(t)
	if bad.hits > 100 {
		t.Fatalf("the server failing fast took %d of 400 calls", bad.hits)
	}
}

// TestSimSRVWeightPerRecord: an SRV target with two addresses shares its
// record's weight between them: equal records, equal shares.
func TestSimSRVWeightPerRecord(t *testing.T) {
	w, sp := simSmall(t, 2, map[int]bool{0: true}, PoolConfig{Stall: -1}, true, 1)
	sp.setDNS(sp.dnsList(map[string]bool{"t0.sim.test": true, "t1.sim.test": true}, nil,
		map[string]uint16{"t0.sim.test": 1, "t1.sim.test": 1}))
	for range 400 {
		w.call(sp.views[0], simCallOpts{})
	}
	w.mustOK(t)
	single := w.servers[2] // t1's only address (t0 has two: 0 and 1)
	if single.target != "t1.sim.test" || single.hits < 180 || single.hits > 220 {
		t.Fatalf("the single-address target took %d of 400 calls, want half", single.hits)
	}
}

// TestSimStallCrossesTiers: a stalled server of the first tier gives way
// to a healthy one of the next.
func TestSimStallCrossesTiers(t *testing.T) {
	w, sp := simSmall(t, 2, nil, PoolConfig{}, true, 2)
	sp.setDNS(sp.dnsList(map[string]bool{"t0.sim.test": true, "t1.sim.test": true},
		map[string]uint16{"t0.sim.test": 0, "t1.sim.test": 10}, nil))
	v := sp.views[0]
	w.stallElsewhere(v, w.servers[0].addr)
	for range 40 {
		if c := w.call(v, simCallOpts{}); c.err != nil {
			t.Fatal(c.err)
		}
	}
	w.mustOK(t)
	if w.servers[0].hits != 0 {
		t.Fatalf("the stalled primary took %d of 40 calls, the backup %d", w.servers[0].hits, w.servers[1].hits)
	}
}

// TestSimRetryRefund: a retry that no server takes gives back what it
// withdrew from the retry budget.
func TestSimRetryRefund(t *testing.T) {
	cfg := PoolConfig{Retries: 1, RetryRatio: -1, RetryMinPerS: 1, Stall: -1}
	w, sp := simSmall(t, 2, nil, cfg, false, 1)
	p := sp.views[0].p
	a, b := w.servers[0], w.servers[1]
	b.dead = true
	b.epoch++
	for _, bk := range b.backends {
		bk.lose()
	}
	a.slow = 50 * time.Millisecond
	c := w.startCall(sp.views[0], simCallOpts{deadline: time.Second})
	w.runFor(10 * time.Millisecond)
	a.dead = true // the only server goes with the call on it
	a.epoch++
	for _, bk := range a.backends {
		bk.lose()
	}
	w.runFor(time.Millisecond)
	w.mustOK(t)
	if c.done != 1 || !errors.Is(c.err, ErrConnLost) {
		t.Fatalf("the call: done %d, %v", c.done, c.err)
	}
	spent := int64(0)
	for i := range budgetWindow {
		spent += p.budget.spent[i].Load()
	}
	if spent != 0 {
		t.Fatalf("the retry no server took kept %d of the budget", spent)
	}
}

// TestSimImportCap: an imported list keeps at most maxPeers servers.
func TestSimImportCap(t *testing.T) {
	w, sp := simSmall(t, 2, nil, PoolConfig{Resolve: time.Hour, Stall: -1}, false, 1)
	w.addServers(maxPeers+44, nil)
	w.servers = slices.DeleteFunc(w.servers, func(s *simServer) bool { return s.idx < 2 })
	v := sp.views[0]
	var list []Resolved
	for _, s := range w.servers {
		list = append(list, Resolved{Addr: s.addr, Name: "svc.sim.test"})
	}
	v.seed()
	if err := v.p.ImportResolved(list); err != nil {
		t.Fatal(err)
	}
	v.settle()
	if n := len(v.p.set.Load().peers); n != maxPeers {
		t.Fatalf("%d servers from a list of %d, at most %d", n, len(list), maxPeers)
	}
}

// TestSimTLSNameChange: a server whose TLS name changes gets a new client
// (checking the new name); the old one drains. The new client is a real
// one, dialling a loopback port nothing listens on.
func TestSimTLSNameChange(t *testing.T) {
	w := newSimWorld(t, 42, simKnobs{})
	w.servers = []*simServer{{addr: "127.0.0.1:" + strconv.Itoa(freeUDPPort(t)), target: "old.sim.test"}}
	w.addServers(1, nil)
	sp := w.newPool("pa", PoolConfig{Stall: -1, Config: Config{InsecureSkipVerify: true}}, true, 1)
	v := sp.views[0]
	addr := w.servers[0].addr
	old := v.p.peers[addr]
	if old == nil || old.name != "old.sim.test" {
		t.Fatalf("peer %v", old)
	}
	list := sp.dnsList(map[string]bool{"old.sim.test": true, w.servers[1].target: true}, nil, nil)
	list[slices.IndexFunc(list, func(r Resolved) bool { return r.Addr == addr })].Name = "new.sim.test"
	v.resolveWith(list)
	t.Cleanup(func() { _ = v.p.Close() })
	nu := v.p.peers[addr]
	if nu == old || nu.name != "new.sim.test" {
		t.Fatalf("the server's TLS name changed, and its peer is the old one (%q)", nu.name)
	}
	if !old.h.Load().draining && !old.h.Load().removed {
		t.Fatal("the old client neither drains nor is gone")
	}
}

func freeUDPPort(t *testing.T) int {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// TestSimListImportKeepsOneUp: a DNS change that takes out the only
// server up and not ejected gives one of the ejected ones back (the last
// server up is never ejected by policy), so calls go on instead of
// failing "no server up" until an ejection ends.
func TestSimListImportKeepsOneUp(t *testing.T) {
	cfg := PoolConfig{Failures: 2, Eject: 10 * time.Second, Stall: -1}
	w, sp := simSmall(t, 3, nil, cfg, false, 1)
	v := sp.views[0]
	for _, s := range w.servers[:2] {
		pr := v.p.peers[s.addr]
		v.p.outcome(pr, 0, errTimeoutForTest())
		v.p.outcome(pr, 0, errTimeoutForTest())
		if !pr.h.Load().ejected() {
			t.Fatalf("%s not ejected with a server up", s.addr)
		}
	}
	sp.setDNS(sp.dnsList(map[string]bool{"t0.sim.test": true, "t1.sim.test": true}, nil, nil))
	w.runFor(time.Millisecond)
	w.mustOK(t)
	up := 0
	for _, s := range w.servers[:2] {
		if !v.p.peers[s.addr].h.Load().ejected() {
			up++
		}
	}
	if up != 1 {
		t.Fatalf("%d of the 2 ejected servers back after the server up left, want 1", up)
	}
	if c := w.call(v, simCallOpts{}); c.done == 0 || c.err != nil {
		t.Fatalf("a call after the change: done %d err %v", c.done, c.err)
	}
	w.mustOK(t)
}
