package bridge

import (
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/metrics"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Metrics and error messages.
//
// The runtime owns the worker's metrics.Registry. Every connection of the
// table is a qrpc.Pool whose Observer is r.metrics.Pool(key): the pool
// itself reports each server's calls, events, in-flight calls, states,
// ejections, reconnects and frame bytes. A call that fails before any
// server is chosen ("unavailable: no server up") has no server to be
// counted under and is not counted.

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

// Metrics is the worker's registry.
func (r *Runtime) Metrics() *metrics.Registry { return r.metrics }

// MetricsQuery answers QRPC_OP_METRICS: what is "" (this worker's figures,
// text format), "snapshot" (the same for a shared dict) or "render" (the
// text format of body, the dict's contents). See metrics.Registry.Query.
func (r *Runtime) MetricsQuery(what string, body []byte) ([]byte, error) {
	return r.metrics.Query(what, body)
}

// reasonFields splits an error with a word and a reason (qrpc.Classify)
// into what a caller compares, "word: reason", and the detail.
func reasonFields(err error) (string, string) {
	rs := qrpc.Classify(err)
	detail := rs.Detail
	rs.Detail = ""
	return rs.String(), detail
}
