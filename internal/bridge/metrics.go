package bridge

import (
	"sync"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/metrics"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Metrics and error messages.
//
// The runtime owns the worker's metrics.Registry. A connection of the
// table is one qrpc.Client to one server, so the bridge records for it as
// the Observer of a pool of one server would be told: calls, events,
// in-flight, state, reconnects. (A qrpc.Pool calls the Observer itself;
// once connections are pools, the pool gets r.metrics.Pool(key) and these
// hooks go.) Frame bytes are counted by qrpc's client, which the bridge
// does not see: qrpc_client_bytes_total stays 0 until then.

// callRec is what a unary call's completion needs to record it: the
// method's series is resolved when the call starts, on the caller's
// thread, while the method name (the caller's memory) is valid.
type callRec struct {
	series *metrics.Series
	began  time.Time
}

// Connections of the table to the same server (with different options)
// share its recorder: it is up while one of them is open.
var (
	peerUseMu sync.Mutex
	peerUse   = map[*metrics.Peer]int{}
)

// peerFor returns the recorder of a new connection's server.
func (r *Runtime) peerFor(addr string) *metrics.Peer {
	pe := r.metrics.Pool(addr).PeerOf(addr)
	peerUseMu.Lock()
	defer peerUseMu.Unlock()
	peerUse[pe]++
	pe.StateChanged(qrpc.PeerUp)
	return pe
}

func (c *conn) callStarted(method []byte) callRec {
	c.peer.InflightAdd(1)
	return callRec{series: c.peer.Series(method), began: time.Now()}
}

func (c *conn) callDone(rec callRec, resp *qrpc.Response, err error) {
	var code uint32
	if err == nil && resp != nil {
		code = resp.Code
	}
	rec.series.CallDone(code, err, time.Since(rec.began))
	c.peer.InflightAdd(-1)
}

// callCancelled: the caller gave up on the call (its light thread was
// killed, its client went away). It is not counted as a call: nobody saw
// its outcome.
func (c *conn) callCancelled() { c.peer.InflightAdd(-1) }

func (c *conn) eventDone(method []byte, err error) {
	c.peer.Series(method).EventDone(err)
}

// syncReconnects reports the reconnects qrpc.Client counted since the
// last look (the client has no hook for them).
func (c *conn) syncReconnects() {
	n := c.client.Stats().Reconnects
	for seen := c.reconnectsSeen.Load(); seen < n; seen++ {
		if c.reconnectsSeen.CompareAndSwap(seen, seen+1) {
			c.peer.Reconnected()
		}
	}
}

// connClosed records that a connection left the table.
func (c *conn) connClosed() {
	c.syncReconnects()
	peerUseMu.Lock()
	defer peerUseMu.Unlock()
	if peerUse[c.peer]--; peerUse[c.peer] <= 0 {
		delete(peerUse, c.peer)
		c.peer.StateChanged(qrpc.PeerRemoved)
	}
}

func init() {
	RegisterQuery(OpMetrics, func(r *Runtime, cmd *Command) ([]byte, error) {
		out, err := r.MetricsQuery(string(cmd.Method), cmd.Body)
		if err != nil {
			// Unknown what, or a dump that does not parse: the caller's.
			return nil, Badf("%v", err)
		}
		return out, nil
	})
}

// MetricsQuery answers QRPC_OP_METRICS: what is "" (this worker's figures,
// text format), "snapshot" (the same for a shared dict) or "render" (the
// text format of body, the dict's contents). See metrics.Registry.Query.
func (r *Runtime) MetricsQuery(what string, body []byte) ([]byte, error) {
	if what != "render" {
		for _, c := range *r.conns.Load() {
			c.syncReconnects()
		}
	}
	return r.metrics.Query(what, body)
}

// reasonMessage is the message of an error with a word and a reason
// (qrpc.Classify): "word: reason (detail)", the detail shortened so the
// whole fits maxMsgLen and the fixed part is never cut. connect errors
// carry no detail (the reason says it; the TLS text is long).
func reasonMessage(err error) string {
	rs := qrpc.Classify(err)
	if rs.Word == qrpc.WordConnect {
		rs.Detail = ""
	}
	s := rs.String()
	if len(s) <= maxMsgLen || rs.Reason == "" {
		return Clip(s)
	}
	fixed := len(rs.Word) + 2 + len(rs.Reason) + 2 // "word: reason ("
	keep := maxMsgLen - fixed - len("...)")
	if keep <= 0 {
		rs.Detail = ""
		return Clip(rs.String())
	}
	rs.Detail = rs.Detail[:keep] + "..."
	return rs.String()
}
