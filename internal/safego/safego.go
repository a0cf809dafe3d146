// Package safego starts the library's goroutines. The library runs inside
// an nginx worker: a panic that escapes a goroutine ends the process, and
// with it every request the worker serves. So every goroutine the library
// starts (and every function it hands to time.AfterFunc) goes through Go
// or Func: a panic is recovered, reported once with its stack, counted by
// where it happened, and the goroutine's owner undoes what it had begun
// (fails the calls it owned, gives back what it counted) in onPanic.
// `make lint` fails on a go statement or a time.AfterFunc elsewhere in the
// library's code (internal/golint).
package safego

import (
	"fmt"
	"log/slog"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Reporter is told about each recovered panic: where is the kind of
// goroutine (a short fixed name, a metric label), v the panic's value and
// stack the goroutine's stack at the panic.
type Reporter func(where string, v any, stack []byte)

var reporter atomic.Pointer[Reporter]

// SetReporter replaces the reporter (nil: the default, which logs to
// slog's default logger). The runtime of the library sets one that writes
// to nginx's error log.
func SetReporter(r Reporter) {
	if r == nil {
		reporter.Store(nil)
		return
	}
	reporter.Store(&r)
}

// counts holds a counter for every kind of goroutine started so far
// (Go, Func, AfterFunc note it): a kind that never panicked still shows,
// as 0, so that a rate over the metric has a start. Reads of a known kind
// take no lock.
var counts sync.Map // where -> *atomic.Uint64

func counter(where string) *atomic.Uint64 {
	if c, ok := counts.Load(where); ok {
		return c.(*atomic.Uint64)
	}
	c, _ := counts.LoadOrStore(where, new(atomic.Uint64))
	return c.(*atomic.Uint64)
}

// Count is one kind of goroutine's recovered panics.
type Count struct {
	Where string
	N     uint64
}

// Counts lists the panics recovered so far by where, sorted, with a 0
// for every kind started and never recovered from.
func Counts() []Count {
	var out []Count
	counts.Range(func(k, v any) bool {
		out = append(out, Count{Where: k.(string), N: v.(*atomic.Uint64).Load()})
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Where < out[j].Where })
	return out
}

// Go runs fn on a new goroutine. A panic in fn is recovered and reported,
// then onPanic (nil: nothing) runs on the same goroutine; a panic in
// onPanic is recovered and reported too, and goes no further.
func Go(where string, fn func(), onPanic func()) {
	counter(where)
	go run(where, fn, onPanic)
}

// Func wraps fn as Go does, for a function another goroutine runs:
// time.AfterFunc's, or a callback the caller starts itself.
func Func(where string, fn func(), onPanic func()) func() {
	counter(where)
	return func() { run(where, fn, onPanic) }
}

// AfterFunc is time.AfterFunc(d, Func(where, fn, onPanic)).
func AfterFunc(where string, d time.Duration, fn func(), onPanic func()) *time.Timer {
	return time.AfterFunc(d, Func(where, fn, onPanic))
}

// Run runs fn on the calling goroutine as Go would on a new one, and
// reports whether it panicked: a loop that must outlive a panic of its
// body (a poll loop, a re-dial loop) runs the body again after onPanic
// has put things right.
func Run(where string, fn func(), onPanic func()) (panicked bool) {
	counter(where)
	defer Recover(where, func() {
		panicked = true
		if onPanic != nil {
			onPanic()
		}
	})
	fn()
	return false
}

func run(where string, fn func(), onPanic func()) {
	defer Recover(where, onPanic)
	fn()
}

// Recover is deferred at the top of code that runs on a goroutine the
// library did not start through Go (a callback of another package): it
// recovers a panic, reports it and runs onPanic (nil: nothing).
func Recover(where string, onPanic func()) {
	v := recover()
	if v == nil {
		return
	}
	report(where, v, debug.Stack())
	if onPanic != nil {
		func() {
			defer func() {
				if v := recover(); v != nil {
					report(where+" cleanup", v, debug.Stack())
				}
			}()
			onPanic()
		}()
	}
}

// Report counts and reports a panic recovered by code that must see its
// value (an export turning it into an error message).
func Report(where string, v any, stack []byte) { report(where, v, stack) }

func report(where string, v any, stack []byte) {
	counter(where).Add(1)
	if r := reporter.Load(); r != nil {
		func() {
			defer func() { _ = recover() }() // a broken reporter must not crash either
			(*r)(where, v, stack)
		}()
		return
	}
	slog.Default().Error("qrpc: panic recovered", "where", where, "panic", fmt.Sprint(v), "stack", string(stack))
}
