package bridge

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The worker's GOMAXPROCS, adapted to its load.
//
// One P costs the least CPU per call when many calls are in flight (the
// nginx thread and Go then take turns on one P instead of waking spinning
// threads: 0.64x the CPU per request, 1.30x the requests/s under wrk in
// the GOMAXPROCS bench), but a lone call waits for sysmon to hand the P
// over (a sequential call takes 1.9x as long). So with the library's
// default (no GOMAXPROCS in the environment, no configure{ gomaxprocs })
// the runtime watches the mean number of calls in flight as calls start,
// and runs on 1 P while it is high and on the default (at most 2) while
// it is low.

const (
	autoEvery    = 250 * time.Millisecond
	autoMinCalls = 100 // fewer calls in a period: latency first (the default Ps)
	autoHigh     = 8   // mean calls in flight at or above which 1 P serves better
	autoLow      = 3   // at or below which the default Ps come back
)

// procsFixed is set once the user chose GOMAXPROCS (configure): the
// controller then stops.
var procsFixed atomic.Bool

// autoProcs owns the adapting goroutine.
type autoProcs struct {
	r    *Runtime
	hi   int
	stop chan struct{}
	done chan struct{}
	once sync.Once

	prevCalls, prevSum uint64
	switches           atomic.Uint64
}

// StartAutoGOMAXPROCS adapts GOMAXPROCS between 1 and hi (the default in
// force) to r's load, every period (0: 250 ms), until stop is called or the user
// sets GOMAXPROCS through Configure. stop waits for the goroutine.
func (r *Runtime) StartAutoGOMAXPROCS(hi int, every time.Duration) (stop func()) {
	if every <= 0 {
		every = autoEvery
	}
	a := &autoProcs{r: r, hi: hi, stop: make(chan struct{}), done: make(chan struct{})}
	a.prevCalls, a.prevSum = r.calls.Load(), r.concSum.Load()
	go a.run(every)
	return func() {
		a.once.Do(func() { close(a.stop) })
		<-a.done
	}
}

func (a *autoProcs) run(every time.Duration) {
	defer close(a.done)
	defer a.r.RecoverLog("gomaxprocs")
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		if procsFixed.Load() {
			return
		}
		a.tick()
	}
}

// tick decides from the calls started since the last tick.
func (a *autoProcs) tick() {
	calls, sum := a.r.calls.Load(), a.r.concSum.Load()
	n, s := calls-a.prevCalls, sum-a.prevSum
	a.prevCalls, a.prevSum = calls, sum
	cur := runtime.GOMAXPROCS(0)
	want := cur
	switch {
	case n < autoMinCalls:
		want = a.hi
	case s >= autoHigh*n:
		want = 1
	case s <= autoLow*n:
		want = a.hi
	}
	if want != cur && !procsFixed.Load() {
		runtime.GOMAXPROCS(want)
		a.switches.Add(1)
		a.r.logger.Debug("qrpc: gomaxprocs adapted", "from", cur, "to", want, "calls", n, "mean_inflight", float64(s)/float64(max(n, 1)))
	}
}
