// Package bufcache keeps freed large buffers of an allocator (C's malloc in
// the library) for reuse, within a fixed byte budget.
//
// Why: every result the library hands to Lua is a malloc'd block that Lua
// frees once it has copied it into a string. With many calls in flight,
// freeing those blocks makes glibc's heap top grow past its trim threshold
// (128 KiB by default, checked on every free of 64 KiB or more), so free()
// gives the pages back to the kernel (brk) and the next allocation faults
// them in again: at 100 KB and 100 light threads, up to 22 page faults
// per call, 350 µs of worker CPU per call instead of 10, the echo 40 times
// slower than with the blocks kept (bench/results.md, IPC section). How
// often it happens depends on what else has used the heap, which made the
// same figure differ eightfold between two sections of one bench run.
//
// The blocks stay what the contract promises: plain malloc'd memory that
// free() also accepts. The cache never adds a header; on Free it asks the
// allocator how big the block is (malloc_usable_size), so a block freed
// directly with free() is simply never seen again, and a block of any
// origin can be cached. Blocks left unused for a whole trim interval are
// given back, so an idle worker returns to glibc what a burst left.
package bufcache

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Allocator is the memory underneath.
type Allocator interface {
	// Alloc returns n bytes, or nil when memory is exhausted.
	Alloc(n int) unsafe.Pointer
	Free(p unsafe.Pointer)
	// FreeBelow frees p and returns 0 when the block at p holds fewer than
	// min bytes; else it leaves p alone and returns how many bytes the
	// block can hold (at least what Alloc was asked for). One call decides
	// and frees: for C memory that is one cgo call on the common path, as
	// free() alone was.
	FreeBelow(p unsafe.Pointer, min int) int
}

// Sizes are in classes of four per power of two (a block is at most 25 %
// bigger than asked), from MinBlock to MaxBlock. Smaller blocks are
// glibc's fast bins' business and never trigger a trim; bigger ones are
// rare and would eat the budget.
const (
	MinBlock = 16 << 10
	MaxBlock = 4 << 20

	minShift   = 14 // log2(MinBlock)
	perOctave  = 4
	numClasses = (22-minShift)*perOctave + 1 // up to and including MaxBlock
)

// DefaultBudget is what a worker keeps at most: the working set of 100
// calls of 100 KB in flight fits, with room.
const DefaultBudget = 16 << 20

// DefaultTrimInterval: a block that stayed unused through a whole
// interval is freed (so within two of them).
const DefaultTrimInterval = 2 * time.Second

// classSize is the size of class c.
func classSize(c int) int {
	o, j := c/perOctave, c%perOctave
	return (perOctave + j) << (minShift + o) / perOctave
}

// classFor is the smallest class whose blocks hold n bytes; -1 when n is
// outside [MinBlock, MaxBlock].
func classFor(n int) int {
	if n < MinBlock || n > MaxBlock {
		return -1
	}
	// n in (2^k, 2^(k+1)]: classes of octave k-minShift... step by quarters.
	k := bits.Len(uint(n-1)) - 1 // 2^k < n <= 2^(k+1) for n > 1
	if k < minShift {
		return 0
	}
	o := k - minShift
	step := 1 << k / perOctave
	j := (n - (1 << k) + step - 1) / step // 1..4 quarters above 2^k
	return o*perOctave + j
}

// classHolding is the biggest class whose size is at most u (a block of u
// usable bytes serves requests of that class); -1 when none.
func classHolding(u int) int {
	if u < MinBlock {
		return -1
	}
	if u >= MaxBlock {
		return numClasses - 1
	}
	k := bits.Len(uint(u)) - 1 // 2^k <= u < 2^(k+1)
	o := k - minShift
	step := 1 << k / perOctave
	j := (u - (1 << k)) / step // 0..3
	return o*perOctave + j
}

type block struct {
	p unsafe.Pointer
	n int // usable bytes
}

type class struct {
	free []block
	low  int // fewest blocks free since the last trim: those were not needed
}

// Cache is an Allocator that keeps freed blocks within a budget. Safe for
// concurrent use.
type Cache struct {
	base     Allocator
	budget   int
	interval time.Duration
	now      func() time.Time // time.Now; tests move it

	held atomic.Bool // bytes > 0: Tick has something to do

	mu       sync.Mutex
	classes  [numClasses]class
	bytes    int // held in the cache
	lastTrim time.Time
	hits     uint64
	misses   uint64
}

// New caches base's blocks up to budget bytes; blocks unused for interval
// are freed (checked on Free and Tick).
func New(base Allocator, budget int, interval time.Duration) *Cache {
	return &Cache{base: base, budget: budget, interval: interval, now: time.Now, lastTrim: time.Now()}
}

// Alloc returns a block of at least n bytes: a cached one of n's class if
// there is one, else a new one of the class's size.
func (c *Cache) Alloc(n int) unsafe.Pointer {
	k := classFor(n)
	if k < 0 {
		return c.base.Alloc(n)
	}
	c.mu.Lock()
	cl := &c.classes[k]
	if m := len(cl.free); m > 0 {
		b := cl.free[m-1]
		cl.free[m-1] = block{}
		cl.free = cl.free[:m-1]
		cl.low = min(cl.low, m-1)
		c.bytes -= b.n
		c.hits++
		c.mu.Unlock()
		return b.p
	}
	c.misses++
	c.mu.Unlock()
	return c.base.Alloc(classSize(k))
}

// Free keeps p for reuse if it is big enough and the budget has room,
// else frees it.
func (c *Cache) Free(p unsafe.Pointer) {
	if p == nil {
		return
	}
	u := c.base.FreeBelow(p, MinBlock)
	if u == 0 {
		return
	}
	k := classHolding(u)
	if k < 0 || u >= MaxBlock+MaxBlock/perOctave {
		c.base.Free(p)
		return
	}
	c.mu.Lock()
	if c.bytes+u > c.budget {
		c.mu.Unlock()
		c.base.Free(p)
		return
	}
	cl := &c.classes[k]
	for _, b := range cl.free {
		if b.p == p {
			// Freed twice: glibc may abort on that; cached twice, the block
			// would be handed to two results at once. Keep it once.
			c.mu.Unlock()
			return
		}
	}
	cl.free = append(cl.free, block{p, u})
	c.bytes += u
	c.held.Store(true)
	c.trimLocked(c.now())
	c.mu.Unlock()
}

// Tick frees the blocks that waited a whole interval unused; the host
// calls it regularly (the dispatcher's poll), so that an idle worker gives
// back what a burst left.
func (c *Cache) Tick() {
	if !c.held.Load() {
		return // the common case with small results: no lock, no clock
	}
	c.mu.Lock()
	c.trimLocked(c.now())
	c.mu.Unlock()
}

func (c *Cache) trimLocked(now time.Time) {
	if now.Sub(c.lastTrim) < c.interval {
		return
	}
	c.lastTrim = now
	for k := range c.classes {
		cl := &c.classes[k]
		for ; cl.low > 0; cl.low-- {
			m := len(cl.free)
			b := cl.free[m-1]
			cl.free[m-1] = block{}
			cl.free = cl.free[:m-1]
			c.bytes -= b.n
			c.base.Free(b.p)
		}
		cl.low = len(cl.free)
		if len(cl.free) == 0 && cap(cl.free) > 64 {
			cl.free = nil // a burst's slice need not stay either
		}
	}
	c.held.Store(c.bytes > 0)
}

// FreeAll frees every kept block now (the host is shutting down).
func (c *Cache) FreeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.classes {
		cl := &c.classes[k]
		for i, b := range cl.free {
			c.base.Free(b.p)
			cl.free[i] = block{}
		}
		cl.free, cl.low = nil, 0
	}
	c.bytes = 0
	c.held.Store(false)
}

// Stats are a cache's counters.
type Stats struct {
	Bytes  int // held now
	Blocks int
	Hits   uint64 // allocations served from the cache
	Misses uint64 // allocations of a cacheable size that were not
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{Bytes: c.bytes, Hits: c.hits, Misses: c.misses}
	for k := range c.classes {
		s.Blocks += len(c.classes[k].free)
	}
	return s
}
