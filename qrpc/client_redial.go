package qrpc

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"
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

func (sl *slot) run(s *qconn) {
	c := sl.c
	defer c.wg.Done()
	// attempt counts consecutive failed dials, and connections that died
	// before they had been up for BackoffBase. gRPC resets the backoff after
	// any successful connection; here one that dies at once (a server that
	// accepts and then closes) counts as a failure, or the client would
	// re-dial it in a tight loop.
	attempt := 0
	everUp := s != nil
	for {
		if s != nil {
			up := c.clk.Now()
			select {
			case <-s.done:
			case <-s.conn.Context().Done():
				// Connection-level end seen before any stream noticed it.
				s.fail(context.Cause(s.conn.Context()))
			case <-c.ctx.Done():
				s.fail(ErrClosed)
				s.release()
				return
			}
			s.release()
			sl.lastErr.Store(&s.err)
			if s.refusal != nil {
				sl.refusal.Store(&s.refusal)
			}
			sl.cur.Store(nil)
			c.stateChanged()
			if c.clk.Now().Sub(up) >= c.cfg.BackoffBase {
				attempt = 0
			}
			c.cfg.Logger.Warn("qrpc connection lost, re-dialling", "addr", c.addr, "err", s.err)
		}
		for ; ; attempt++ {
			if attempt > 0 {
				wake := make(chan struct{})
				t := c.clk.AfterFunc(c.backoff(attempt-1), func() { close(wake) })
				select {
				case <-wake:
				case <-c.ctx.Done():
					t.Stop()
					return
				}
			}
			ns, err := c.dial(c.ctx)
			if err == nil {
				s = ns
				sl.refusal.Store(nil)
				sl.cur.Store(ns)
				if everUp {
					c.reconnects.Add(1)
					c.obs.Reconnected()
					c.cfg.Logger.Info("qrpc connection re-established", "addr", c.addr, "attempt", attempt+1)
				}
				everUp = true
				c.stateChanged()
				attempt++
				break
			}
			if c.ctx.Err() != nil {
				return
			}
			sl.lastErr.Store(&err)
			c.cfg.Logger.Warn("qrpc re-dial failed", "addr", c.addr, "attempt", attempt+1, "err", err)
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
