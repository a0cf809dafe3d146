package bufcache

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// goAlloc is an Allocator over Go memory that knows every block it handed
// out: freeing an unknown block (or one twice) fails the test.
type goAlloc struct {
	t     testing.TB
	mu    sync.Mutex
	live  map[unsafe.Pointer][]byte
	frees int
}

func newGoAlloc(t testing.TB) *goAlloc {
	return &goAlloc{t: t, live: map[unsafe.Pointer][]byte{}}
}

func (a *goAlloc) Alloc(n int) unsafe.Pointer {
	b := make([]byte, max(n, 1))
	p := unsafe.Pointer(&b[0])
	a.mu.Lock()
	a.live[p] = b
	a.mu.Unlock()
	return p
}

func (a *goAlloc) Free(p unsafe.Pointer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.live[p]; !ok {
		a.t.Errorf("free of %p: not a live block", p)
		return
	}
	delete(a.live, p)
	a.frees++
}

func (a *goAlloc) FreeBelow(p unsafe.Pointer, min int) int {
	a.mu.Lock()
	b, ok := a.live[p]
	a.mu.Unlock()
	if !ok {
		a.t.Errorf("free of %p: not a live block", p)
		return 0
	}
	if len(b) < min {
		a.Free(p)
		return 0
	}
	return len(b)
}

func (a *goAlloc) size(p unsafe.Pointer) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.live[p])
}

func (a *goAlloc) nLive() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.live)
}

func TestClasses(t *testing.T) {
	if got := classSize(numClasses - 1); got != MaxBlock {
		t.Fatalf("last class is %d bytes, want MaxBlock %d", got, MaxBlock)
	}
	for c := 0; c < numClasses; c++ {
		s := classSize(c)
		if c > 0 && s <= classSize(c-1) {
			t.Fatalf("class %d (%d) not above class %d (%d)", c, s, c-1, classSize(c-1))
		}
		if got := classFor(s); got != c {
			t.Fatalf("classFor(%d) = %d, want %d", s, got, c)
		}
		if got := classHolding(s); got != c {
			t.Fatalf("classHolding(%d) = %d, want %d", s, got, c)
		}
	}
	for n := MinBlock; n <= MaxBlock; n += 997 {
		c := classFor(n)
		if s := classSize(c); s < n || 4*s > 5*n {
			t.Fatalf("classFor(%d) = class of %d bytes: too small or more than 25%% over", n, s)
		}
		if c > 0 && classSize(c-1) >= n {
			t.Fatalf("classFor(%d) = %d, but class %d also holds it", n, c, c-1)
		}
		h := classHolding(n)
		if classSize(h) > n || (h+1 < numClasses && classSize(h+1) <= n) {
			t.Fatalf("classHolding(%d) = %d (%d bytes): not the biggest class that fits", n, h, classSize(h))
		}
	}
	for _, n := range []int{0, 1, MinBlock - 1, MaxBlock + 1} {
		if c := classFor(n); c != -1 {
			t.Fatalf("classFor(%d) = %d, want -1 (not cached)", n, c)
		}
	}
	if c := classHolding(MinBlock - 1); c != -1 {
		t.Fatalf("classHolding(MinBlock-1) = %d", c)
	}
}

func TestReuse(t *testing.T) {
	a := newGoAlloc(t)
	c := New(a, DefaultBudget, time.Hour)
	p := c.Alloc(100 << 10)
	if n := a.size(p); n < 100<<10 {
		t.Fatalf("block of %d bytes for 100 KiB", n)
	}
	c.Free(p)
	if s := c.Stats(); s.Blocks != 1 || s.Bytes != a.size(p) {
		t.Fatalf("after a free: %+v", s)
	}
	if q := c.Alloc(100<<10 - 100); q != p {
		t.Fatalf("second allocation of the class did not reuse the block")
	}
	if s := c.Stats(); s.Hits != 1 || s.Misses != 1 || s.Blocks != 0 || s.Bytes != 0 {
		t.Fatalf("stats %+v, want 1 hit, 1 miss, nothing held", s)
	}
	// A bigger class does not take it.
	c.Free(p)
	if q := c.Alloc(200 << 10); q == p {
		t.Fatal("a 200 KiB request got a 100 KiB block")
	}
	// Small and huge blocks go straight back.
	for _, n := range []int{100, MinBlock - 1, MaxBlock + MaxBlock/4} {
		before := a.frees
		c.Free(c.Alloc(n))
		if a.frees != before+1 {
			t.Fatalf("block of %d bytes was kept", n)
		}
	}
}

func TestBudget(t *testing.T) {
	a := newGoAlloc(t)
	const budget = 1 << 20
	c := New(a, budget, time.Hour)
	var ps []unsafe.Pointer
	for i := 0; i < 50; i++ {
		ps = append(ps, c.Alloc(100<<10))
	}
	for _, p := range ps {
		c.Free(p)
	}
	s := c.Stats()
	if s.Bytes > budget || s.Bytes < budget-128<<10 {
		t.Fatalf("holds %d bytes, budget %d", s.Bytes, budget)
	}
	if a.nLive() != s.Blocks {
		t.Fatalf("%d blocks live in the allocator, %d in the cache: the rest should be freed", a.nLive(), s.Blocks)
	}
}

func TestDoubleFreeKeptOnce(t *testing.T) {
	a := newGoAlloc(t)
	c := New(a, DefaultBudget, time.Hour)
	p := c.Alloc(64 << 10)
	c.Free(p)
	c.Free(p)
	if q, r := c.Alloc(64<<10), c.Alloc(64<<10); q == r {
		t.Fatal("a block freed twice was handed out twice")
	}
}

func TestTrimGivesBackIdleBlocks(t *testing.T) {
	a := newGoAlloc(t)
	now := time.Unix(1000, 0)
	c := New(a, DefaultBudget, time.Second)
	c.now = func() time.Time { return now }
	c.lastTrim = now
	var ps []unsafe.Pointer
	for i := 0; i < 20; i++ {
		ps = append(ps, c.Alloc(100<<10))
	}
	for _, p := range ps {
		c.Free(p)
	}
	// They arrived during this interval: none has waited a whole one.
	now = now.Add(1100 * time.Millisecond)
	c.Tick()
	if s := c.Stats(); s.Blocks != 20 {
		t.Fatalf("after the interval they were freed in, %d blocks held, want 20", s.Blocks)
	}
	// Busy: 5 of the 20 are used during the next interval, 15 never leave.
	for i := 0; i < 5; i++ {
		ps[i] = c.Alloc(100 << 10)
	}
	for i := 0; i < 5; i++ {
		c.Free(ps[i])
	}
	now = now.Add(1100 * time.Millisecond)
	c.Tick()
	if s := c.Stats(); s.Blocks != 5 {
		t.Fatalf("after a busy interval %d blocks held, want the 5 that were used", s.Blocks)
	}
	now = now.Add(1100 * time.Millisecond)
	c.Tick()
	if s := c.Stats(); s.Blocks != 0 || s.Bytes != 0 {
		t.Fatalf("after an idle interval: %+v, want nothing held", s)
	}
	if a.nLive() != 0 {
		t.Fatalf("%d blocks still allocated", a.nLive())
	}
	// Within an interval nothing is trimmed.
	c.Free(c.Alloc(100 << 10))
	now = now.Add(500 * time.Millisecond)
	c.Tick()
	if s := c.Stats(); s.Blocks != 1 {
		t.Fatalf("trimmed before the interval: %+v", s)
	}
}

// Many goroutines allocating, filling, checking and freeing blocks of
// different sizes: a block handed to two owners at once shows as a
// pattern overwritten by another goroutine.
func TestConcurrentNoSharing(t *testing.T) {
	a := newGoAlloc(t)
	c := New(a, 4<<20, 10*time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				n := MinBlock + (g*7919+i*104729)%(300<<10)
				p := c.Alloc(n)
				b := unsafe.Slice((*byte)(p), n)
				pat := bytes.Repeat([]byte{byte(g), byte(i)}, n/2+1)[:n]
				copy(b, pat)
				if i%3 == 0 {
					c.Tick()
				}
				if !bytes.Equal(b, pat) {
					errs <- fmt.Errorf("goroutine %d call %d: block overwritten by another owner", g, i)
					return
				}
				c.Free(p)
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s := c.Stats(); s.Bytes > 4<<20 || a.nLive() != s.Blocks {
		t.Fatalf("after the run: %+v, %d live blocks", s, a.nLive())
	}
}

func TestFreeAll(t *testing.T) {
	a := newGoAlloc(t)
	c := New(a, DefaultBudget, time.Hour)
	var ps []unsafe.Pointer
	for i := 0; i < 10; i++ {
		ps = append(ps, c.Alloc(MinBlock+i*40000))
	}
	for _, p := range ps {
		c.Free(p)
	}
	if s := c.Stats(); s.Blocks != 10 {
		t.Fatalf("kept %d of 10", s.Blocks)
	}
	c.FreeAll()
	if s := c.Stats(); s.Blocks != 0 || s.Bytes != 0 || a.nLive() != 0 {
		t.Fatalf("after FreeAll: %+v, %d live blocks", s, a.nLive())
	}
	// Still usable.
	c.Free(c.Alloc(MinBlock))
	if s := c.Stats(); s.Blocks != 1 {
		t.Fatalf("after FreeAll and one more free: %+v", s)
	}
}
