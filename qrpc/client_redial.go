package qrpc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// slot owns one connection position: the live qconn, and the goroutine
// that dials it (when started empty, as a pool's servers are) and re-dials
// with backoff when it dies.
type slot struct {
	c       *Client
	cur     atomic.Pointer[qconn]
	lastErr atomic.Pointer[error]
	// refusal: the last connection was refused (qconn.refusal), until a
	// new one is up.
	refusal atomic.Pointer[error]
}

// slotRun is what a slot's goroutine knows across a panic of its loop
// (safego.Run runs the loop again after recovered): the live qconn, one
// dialled and not yet published, the failed attempts in a row, and
// whether a connection was ever up.
type slotRun struct {
	s       *qconn
	fresh   *qconn
	attempt int
	everUp  bool
}

func (sl *slot) run(s *qconn) {
	c := sl.c
	defer c.wg.Done()
	st := &slotRun{s: s, everUp: s != nil}
	for safego.Run("redial", func() { sl.loop(st) }, func() { sl.recovered(st) }) {
		if c.ctx.Err() != nil {
			return
		}
	}
}

// recovered puts the slot right after a panic of its loop: the
// connections it held (in place or just dialled) fail their calls with
// ErrInternal and go, and the loop dials again after the backoff.
func (sl *slot) recovered(st *slotRun) {
	err := fmt.Errorf("%w: redial", ErrInternal)
	for _, s := range []*qconn{st.fresh, st.s} {
		if s != nil {
			s.fail(err)
			s.release()
		}
	}
	st.fresh, st.s = nil, nil
	if sl.cur.Swap(nil) != nil {
		sl.c.stateChanged()
	}
	st.attempt++
}

func (sl *slot) loop(st *slotRun) {
	c := sl.c
	// attempt counts consecutive failed dials, and connections that died
	// before they had been up for BackoffBase. gRPC resets the backoff after
	// any successful connection; here one that dies at once (a server that
	// accepts and then closes) counts as a failure, or the client would
	// re-dial it in a tight loop.
	for {
		if s := st.s; s != nil {
			up := c.clk.Now()
			select {
			case <-s.done:
			case <-s.conn.Context().Done():
				// Connection-level end seen before any stream noticed it.
				s.fail(context.Cause(s.conn.Context()))
			case <-c.ctx.Done():
				s.fail(ErrClosed)
				s.release()
				st.s = nil
				return
			}
			s.release()
			sl.lastErr.Store(&s.err)
			// The refusal of the connection that died, or none: an older
			// one no longer says why the slot is down.
			if s.refusal != nil {
				sl.refusal.Store(&s.refusal)
			} else {
				sl.refusal.Store(nil)
			}
			sl.cur.Store(nil)
			st.s = nil
			c.stateChanged()
			if c.clk.Now().Sub(up) >= c.cfg.BackoffBase {
				st.attempt = 0
			}
			c.cfg.Logger.Warn("qrpc connection lost, re-dialling", "addr", c.addr, "err", s.err)
		}
		for ; ; st.attempt++ {
			if st.attempt > 0 {
				wake := make(chan struct{})
				t := c.clk.AfterFunc(c.backoff(st.attempt-1), safego.Func("redial", func() { close(wake) }, nil))
				select {
				case <-wake:
				case <-c.ctx.Done():
					t.Stop()
					return
				}
			}
			ns, err := c.dial(c.ctx)
			if err == nil {
				st.fresh = ns
				safego.Inject("redial")
				st.s, st.fresh = ns, nil
				sl.refusal.Store(nil)
				sl.cur.Store(ns)
				if st.everUp {
					c.reconnects.Add(1)
					c.obs.Reconnected()
					c.cfg.Logger.Info("qrpc connection re-established", "addr", c.addr, "attempt", st.attempt+1)
				}
				st.everUp = true
				c.stateChanged()
				st.attempt++
				break
			}
			if c.ctx.Err() != nil {
				return
			}
			sl.lastErr.Store(&err)
			// This failure is why the slot is down now: a refusal of an
			// earlier connection (a TLS verdict, say) no longer is.
			sl.refusal.Store(nil)
			c.cfg.Logger.Warn("qrpc re-dial failed", "addr", c.addr, "attempt", st.attempt+1, "err", err)
		}
	}
}

// backoff is the gRPC connection-backoff delay before retry n (0-based):
// base × 1.6^n, capped, ±20 % jitter.
func backoff(base, maxDelay time.Duration, n int) time.Duration {
	return backoffJittered(base, maxDelay, n, 2*rand.Float64()-1)
}

// backoff is c's delay before re-dial n: the jitter is the client's own
// when a test gave it one.
func (c *Client) backoff(n int) time.Duration {
	if c.jitter != nil {
		return backoffJittered(c.cfg.BackoffBase, c.cfg.BackoffMax, n, c.jitter())
	}
	return backoff(c.cfg.BackoffBase, c.cfg.BackoffMax, n)
}

// backoffJittered is backoff with its jitter given, in [-1, 1]: -1 takes
// 20 % off, 1 adds 20 %.
func backoffJittered(base, maxDelay time.Duration, n int, jitter float64) time.Duration {
	d := float64(base)
	for i := 0; i < n && d < float64(maxDelay); i++ {
		d *= 1.6
	}
	if d > float64(maxDelay) {
		d = float64(maxDelay)
	}
	d *= 1 + 0.2*jitter
	return time.Duration(d)
}
