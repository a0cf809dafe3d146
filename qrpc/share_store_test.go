package qrpc

import (
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// memStore is a lua_shared_dict as share.lua uses it: values with a TTL
// on the store's clock, add/set/incr/delete, and (with max > 0) least
// recently used eviction when full, as ngx.shared evicts.
type memStore struct {
	now  func() int64 // ns
	max  int
	m    map[string]*memItem
	tick int64 // LRU clock
	// evicted counts the keys evicted to make room
	evicted int
	// noTTL lists the keys written without a TTL (a defect)
	noTTL []string
}

type memItem struct {
	val  []byte
	num  float64
	isN  bool
	exp  int64 // ns; 0: none
	used int64
}

func newMemStore(now func() int64, max int) *memStore {
	return &memStore{now: now, max: max, m: map[string]*memItem{}}
}

func (s *memStore) live(k string) *memItem {
	it := s.m[k]
	if it != nil && it.exp != 0 && s.now() >= it.exp {
		delete(s.m, k)
		return nil
	}
	return it
}

func (s *memStore) touch(it *memItem) {
	s.tick++
	it.used = s.tick
}

// room evicts the least recently used key when the store is full.
func (s *memStore) room() {
	if s.max <= 0 {
		return
	}
	for k := range s.m {
		s.live(k)
	}
	for len(s.m) >= s.max {
		var oldest string
		var used int64 = 1 << 62
		keys := make([]string, 0, len(s.m))
		for k := range s.m {
			keys = append(keys, k)
		}
		sort.Strings(keys) // deterministic among equals
		for _, k := range keys {
			if it := s.m[k]; it.used < used {
				oldest, used = k, it.used
			}
		}
		delete(s.m, oldest)
		s.evicted++
	}
}

func (s *memStore) exp(ttl time.Duration, key string) int64 {
	if ttl <= 0 {
		s.noTTL = append(s.noTTL, key)
		return 0
	}
	return s.now() + int64(ttl)
}

// run executes ops as share.lua does, with the keys under prefix.
func (s *memStore) run(prefix string, ops []StoreOp) []StoreResult {
	out := make([]StoreResult, len(ops))
	for i, op := range ops {
		k := prefix + op.Key
		switch op.Kind {
		case OpGet:
			if it := s.live(k); it != nil {
				s.touch(it)
				if it.isN {
					str := strconv.FormatFloat(it.num, 'f', 0, 64)
					out[i] = StoreResult{OK: true, Value: []byte(str), N: int64(it.num)}
				} else {
					out[i] = StoreResult{OK: true, Value: append([]byte{}, it.val...)}
				}
			}
		case OpAdd:
			if s.live(k) != nil {
				continue
			}
			s.room()
			it := &memItem{val: append([]byte{}, op.Value...), exp: s.exp(op.TTL, op.Key)}
			s.touch(it)
			s.m[k] = it
			out[i] = StoreResult{OK: true}
		case OpSet:
			if s.live(k) == nil {
				s.room()
			}
			it := &memItem{val: append([]byte{}, op.Value...), exp: s.exp(op.TTL, op.Key)}
			s.touch(it)
			s.m[k] = it
			out[i] = StoreResult{OK: true}
		case OpIncr:
			it := s.live(k)
			if it == nil {
				s.room()
				it = &memItem{isN: true, num: float64(op.Init), exp: s.exp(op.TTL, op.Key)}
				s.m[k] = it
			} else if !it.isN {
				continue // not a number: fails, as ngx.shared's incr does
			}
			it.num += float64(op.Delta)
			if op.TTL > 0 {
				it.exp = s.now() + int64(op.TTL)
			}
			s.touch(it)
			out[i] = StoreResult{OK: true, Value: []byte(strconv.FormatFloat(it.num, 'f', 0, 64)), N: int64(it.num)}
		case OpDelete:
			delete(s.m, k)
			out[i] = StoreResult{OK: true}
		}
	}
	return out
}

// keys lists the live keys (without touching them).
func (s *memStore) keys() []string {
	var out []string
	for k, it := range s.m {
		if it.exp == 0 || s.now() < it.exp {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// preOps holds each view's next first round (ShareNext), as share.lua
// keeps it.
var preOps sync.Map // *Pool -> []StoreOp

// stepView runs one whole step of p on s under prefix, as share.lua does
// (with the first round the last step handed out); mode is ShareStep or
// ShareExit. It returns the exchanges with Go it took.
func stepView(p *Pool, s *memStore, prefix string, mode int) int {
	var first []StoreResult
	if pre, ok := preOps.LoadAndDelete(p); ok && mode == ShareStep {
		first = s.run(prefix, pre.([]StoreOp))
	}
	ops, more := p.ShareStep(mode, first)
	rounds := 1
	for {
		res := s.run(prefix, ops)
		if !more {
			if next := p.ShareNext(); next != nil {
				preOps.Store(p, next)
			}
			return rounds
		}
		rounds++
		if rounds > 8 {
			panic("a step of more than 8 rounds")
		}
		ops, more = p.ShareStep(0, res)
	}
}

// TestShareThrottleWindows: a view's throttling window reaches the other
// views at their next step, and they shed on the sum.
func TestShareThrottleWindows(t *testing.T) {
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	views := make([]*Pool, 2)
	for i := range views {
		p, _ := fakePool(t, 2)
		p.clk = clk
		p.throttle = newThrottler(Throttle{K: 2, Codes: []uint32{7}})
		p.Share(ShareConfig{Slot: i, Slots: 2})
		views[i] = p
	}
	for range 200 {
		views[0].throttle.record(clk.Now(), &Response{Code: 7}, nil)
	}
	stepView(views[0], s, "x:", ShareStep)
	stepView(views[1], s, "x:", ShareStep)
	if p := views[1].throttle.probability(clk.Now()); p < 0.9 {
		t.Fatalf("the other view sheds with probability %.2f after 200 overloaded answers elsewhere (store: %v)", p, s.keys())
	}
	if len(s.noTTL) != 0 {
		t.Fatalf("keys without a TTL: %v", s.noTTL)
	}
	for _, k := range s.keys() {
		if !strings.HasPrefix(k, "x:") {
			t.Fatalf("key %q outside the prefix", k)
		}
	}
}

// TestShareLeaseHolderSteps: the lease holder steps more often than it
// renews (on calls, on requests) with nothing else to write: each step
// renews only when due, and one view holds the lease throughout.
func TestShareLeaseHolderSteps(t *testing.T) {
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	var views []*Pool
	for i := range 2 {
		p, _ := fakePool(t, 2)
		p.clk = clk
		p.cfg.Check = HealthCheck{Method: "probe", Interval: time.Second, Timeout: 100 * time.Millisecond}
		p.Share(ShareConfig{Slot: i, Slots: 2})
		views = append(views, p)
	}
	for range 300 {
		for _, p := range views {
			stepView(p, s, "x:", ShareStep)
		}
		probers := 0
		for _, p := range views {
			if !p.share.noProbe.Load() {
				probers++
			}
		}
		if probers != 1 {
			t.Fatalf("%d views probe", probers)
		}
		clk.Advance(37 * time.Millisecond)
	}
	// The holder goes away: the other takes the lease at its next step.
	stepView(views[0], s, "x:", ShareExit)
	stepView(views[1], s, "x:", ShareStep)
	if views[1].share.noProbe.Load() && views[0].share.noProbe.Load() {
		t.Fatal("nobody probes after the holder left")
	}
}

// TestShareIdleStepsFew: an idle shared pool asks its host for steps
// only for its leases: the holder once a renewal interval, a view
// without the lease when the lease it saw ends (each step wakes the
// host's thread). One view probes throughout.
func TestShareIdleStepsFew(t *testing.T) {
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	const interval = 100 * time.Millisecond
	views, asked := checkViews(t, clk, 2, 2, interval, 50*time.Millisecond)
	for _, p := range views {
		stepView(p, s, "x:", ShareStep)
	}
	steps, exchanges := make([]int, 2), make([]int, 2)
	run := func(d time.Duration, count bool) {
		for end := clk.Now().Add(d); clk.Now().Before(end); {
			clk.Advance(10 * time.Millisecond)
			for i, p := range views {
				if asked[i].Swap(false) {
					n := stepView(p, s, "x:", ShareStep)
					if count {
						steps[i]++
						exchanges[i] += n
					}
				}
			}
			probers := 0
			for _, p := range views {
				if !p.share.noProbe.Load() {
					probers++
				}
			}
			if probers != 1 {
				t.Fatalf("%d views probe at %v", probers, clk.Now())
			}
		}
	}
	renew := leaseRenew(interval)
	run(2*renew, false) // the views' first looks
	const span = 40 * time.Second
	run(span, true)
	holder, follower := steps[0], steps[1]
	if views[0].share.noProbe.Load() {
		holder, follower = follower, holder
	}
	// each step: one exchange with Go, its first round run ahead
	if exchanges[0] != steps[0] || exchanges[1] != steps[1] {
		t.Errorf("steps %v took %v exchanges with Go: want one each", steps, exchanges)
	}
	t.Logf("in %v idle with checks every %v: the holder stepped %d times, the other view %d (renewal every %v)", span, interval, holder, follower, renew)
	// Checks every 100 ms: a step a period would be 400 each.
	if limit := int(span/(10*interval)) + 2; holder > limit || follower > limit {
		t.Errorf("in %v, the lease holder stepped %d times, the other view %d: want at most %d each (one every 10 check intervals)", span, holder, follower, limit)
	}
}

// TestShareStallKeyOwner: a server's stall key names the view that saw
// the stall, and only that view deletes it when its stall ends: a view
// whose own stall ended while the key names another leaves the other's
// verdict in place.
func TestShareStallKeyOwner(t *testing.T) {
	clk := newFakeClock()
	s := newMemStore(func() int64 { return monoNS(clk.Now()) }, 0)
	var views []*Pool
	for i := range 2 {
		p, _ := fakePool(t, 2)
		p.clk = clk
		p.cfg.Stall = 200 * time.Millisecond
		p.Share(ShareConfig{Slot: i, Slots: 2})
		views = append(views, p)
	}
	a, b := views[0], views[1]
	addr := a.set.Load().peers[0].addr
	if b.set.Load().peers[0].addr != addr {
		t.Fatalf("the views' first servers differ: %s, %s", addr, b.set.Load().peers[0].addr)
	}
	stall := func(p *Pool, on bool) {
		pr := p.set.Load().peers[0]
		pr.stallSeen.Store(on)
		pr.inflight.Store(int64(b2i(on)))
		stepView(p, s, "x:", ShareStep)
	}
	key := func() string {
		if it := s.live("x:t:" + addr); it != nil {
			return string(it.val)
		}
		return ""
	}
	stall(b, true)
	if got := key(); got != b.share.sh.id {
		t.Fatalf("stall key %q after the second view's stall, want its id %q", got, b.share.sh.id)
	}
	stall(a, true) // the first view's verdict replaces it
	stall(b, false)
	if got := key(); got != a.share.sh.id {
		t.Fatalf("stall key %q after the second view's stall ended, want the first view's verdict %q kept", got, a.share.sh.id)
	}
	stall(a, false)
	if got := key(); got != "" {
		t.Fatalf("stall key %q after the first view's stall ended, want it deleted", got)
	}
}

// checkViews makes n views of a shared pool with active checks every
// interval, on clk, in slots of a pool of the given size; asked[i] is set
// when view i asks its host for a step.
func checkViews(t *testing.T, clk *fakeClock, n, slots int, interval, timeout time.Duration) ([]*Pool, []atomic.Bool) {
	t.Helper()
	var views []*Pool
	asked := make([]atomic.Bool, n)
	for i := range n {
		p, _ := fakePool(t, 2)
		p.clk = clk
		p.cfg.Check = HealthCheck{Method: "probe", Interval: interval, Timeout: timeout}
		p.Share(ShareConfig{Slot: i, Slots: slots, Notify: func() bool { asked[i].Store(true); return true }})
		views = append(views, p)
	}
	return views, asked
}
