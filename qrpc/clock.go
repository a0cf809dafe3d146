package qrpc

import (
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// clock is where a pool reads the time and arms its timers: the real one
// in production; a test gives a pool its own fake one (export_test.go) to
// check the arithmetic of ejections, the retry budget, the EWMA and hedge
// delays exactly. Times it returns carry Go's monotonic reading, and the
// pool compares them only through monoNS: a step of the wall clock moves
// no window.
type clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) timer
}

// timer is the part of *time.Timer a pool uses.
type timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) timer {
	// Callers wrap f with their own kind (safego.Func); this is the
	// backstop for one that does not.
	return safego.AfterFunc("timer", d, f, nil)
}

// monoBase anchors monoNS.
var monoBase = time.Now()

// monoNS is t on the monotonic clock, in ns since monoBase: windows kept
// as such numbers are immune to steps of the wall clock (t must come from
// time.Now, or be derived from one by Add).
func monoNS(t time.Time) int64 { return int64(t.Sub(monoBase)) }

// wallAt renders a monoNS instant as a wall-clock time, for people (logs,
// PeerInfo), from now as read on the same clock.
func wallAt(ns int64, now time.Time) time.Time {
	return now.Add(time.Duration(ns - monoNS(now))).Round(0)
}
