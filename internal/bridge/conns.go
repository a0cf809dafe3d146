package bridge

import (
	"log/slog"
	"strings"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

func (r *Runtime) lookup(h uint64) *conn {
	return (*r.conns.Load())[h]
}

// add registers a dialled client, unless its owner died meanwhile (then
// the caller closes the client). Checking alive under connMu pairs with
// EndGen: no connection can slip in after its owner's sweep.
func (r *Runtime) add(cl *qrpc.Pool, addr string, owner *Gen) *conn {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	if !owner.alive.Load() {
		return nil
	}
	c := &conn{r: r, handle: r.lastHandle.Add(1), addr: addr, client: cl, owner: owner}
	old := *r.conns.Load()
	m := make(map[uint64]*conn, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[c.handle] = c
	r.conns.Store(&m)
	return c
}

// remove takes connections out of the table: the one with handle h, or
// (h == 0) every one owned by owner.
func (r *Runtime) remove(h uint64, owner *Gen) []*conn {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	old := *r.conns.Load()
	var out []*conn
	m := make(map[uint64]*conn, len(old))
	for k, v := range old {
		if (h != 0 && k == h) || (h == 0 && owner != nil && v.owner == owner) {
			out = append(out, v)
			continue
		}
		m[k] = v
	}
	if len(out) > 0 {
		r.conns.Store(&m)
	}
	return out
}

// Conns counts the connections in the table.
func (r *Runtime) Conns() int { return len(*r.conns.Load()) }

// closeClient closes a removed connection. qrpc.Client.Close waits for the
// client's goroutines, so callers on the nginx thread run it in a goroutine.
// Should the close panic before it got under way, it is tried once more:
// its calls must hear "closed" and its goroutines end.
func (r *Runtime) closeClient(c *conn) {
	safego.Run("close", func() {
		safego.Inject("close")
		_ = c.client.Close()
	}, func() { _ = c.client.Close() })
	r.closedReconnects.Add(c.client.Stats().Reconnects)
}

// connectConfig copies a CONNECT command into a qrpc.Config: the dial
// outlives the caller's memory.
func connectConfig(cmd *Command, logger *slog.Logger) ([]string, *qrpc.PoolConfig, error) {
	cfg := &qrpc.Config{
		ServerName:         string(cmd.ServerName),
		CAPEM:              clone(cmd.CA),
		CertPEM:            clone(cmd.Cert),
		KeyPEM:             clone(cmd.Key),
		InsecureSkipVerify: cmd.Insecure,
		Conns:              int(cmd.Conns),
		Streams:            int(cmd.Streams),
		DialTimeout:        time.Duration(cmd.TimeoutMS) * time.Millisecond,
		IdleTimeout:        time.Duration(cmd.IdleTimeoutMS) * time.Millisecond,
		MaxFrameSize:       int(cmd.MaxFrameSize),
		Logger:             logger,
	}
	for p := cmd.Pins; len(p) >= 32; p = p[32:] {
		cfg.Pins = append(cfg.Pins, clone(p[:32]))
	}
	return poolConfig(cmd, cfg)
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// dial connects and registers the connection. It blocks (handshake): run it
// on its own goroutine.
func (r *Runtime) dial(owner *Gen, addrs []string, cfg *qrpc.PoolConfig) (*conn, error) {
	addr := strings.Join(addrs, ",")
	// Pools to the same servers share one recorder (and its method names),
	// so the registry does not grow with every re-created connection.
	// With metrics off the pool gets the no-op observer, exactly what a
	// pool without metrics runs: the cost of recording is then nothing.
	if r.metricsOff.Load() {
		cfg.Observer = observe.Nop{}
	} else {
		cfg.Observer = r.metrics.Pool(addr)
	}
	cl, err := qrpc.DialPool(owner.ctx, addrs, cfg)
	if err != nil {
		if owner.ctx.Err() != nil {
			return nil, qrpc.ErrClosed
		}
		r.logger.Info("qrpc connect failed", "addr", addr, "err", err)
		return nil, err
	}
	c := r.add(cl, addr, owner)
	if c == nil {
		_ = cl.Close()
		return nil, qrpc.ErrClosed
	}
	return c, nil
}

// closeConn removes a connection and closes it in the background (Close
// waits for goroutines; the caller may be the nginx thread). Its pending
// calls complete with "closed".
func (r *Runtime) closeConn(h uint64) error {
	cs := r.remove(h, nil)
	if len(cs) == 0 {
		return qrpc.ErrClosed
	}
	for _, c := range cs {
		safego.Go("close", func() { r.closeClient(c) }, nil)
	}
	return nil
}

// EndGen ends a host's lifetime: dials in progress fail with "closed",
// the calls in calls (if any) are cancelled (no completion will come for
// them), and the lifetime's connections are removed and closed, which
// completes their other calls with "closed". With wait the closing happens
// before EndGen returns; without, in the background (the caller is the
// nginx thread).
func (r *Runtime) EndGen(g *Gen, calls *Calls, wait bool) {
	g.alive.Store(false)
	g.cancel()
	if calls != nil {
		calls.cancelAll()
	}
	for _, c := range r.remove(0, g) {
		if wait {
			r.closeClient(c)
		} else {
			safego.Go("close", func() { r.closeClient(c) }, nil)
		}
	}
}
