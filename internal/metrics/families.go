// Package metrics records what qrpc pools do (calls, latency, events,
// connections) for Prometheus, per nginx worker, and renders the text
// exposition format (version 0.0.4) from one worker's figures or from the
// sum of several workers' figures kept in a lua_shared_dict.
//
// One Registry lives in each worker. Every pool gets its own observe.Observer
// from Registry.Pool, with its own table of method names (at most
// MaxMethods, the rest counted as method="other"); there is no pool label,
// so two pools that call the same server add up in the same series.
package metrics

import "time"

// Fixed limits on label values: a metric's cardinality must not depend on
// what callers or servers send.
const (
	// MaxMethods is the number of method names tracked per pool; calls to
	// further methods are counted under method="other".
	MaxMethods = 256
	// MaxPools is the number of sets of servers (connect addresses) with
	// a method table of their own, per registry; pools to further sets
	// share one.
	MaxPools = 256
	// MaxServers is the number of server labels tracked per registry;
	// further servers are counted under server="other".
	MaxServers = 256
	// maxLabelLen truncates a method name used as a label value.
	maxLabelLen = 128
	// Other is the label value that collects what the caps leave out.
	Other = "other"
)

// Metric names.
const (
	nameCalls       = "qrpc_client_calls_total"
	nameDuration    = "qrpc_client_call_duration_seconds"
	nameEvents      = "qrpc_client_events_total"
	nameInflight    = "qrpc_client_inflight"
	nameConnections = "qrpc_client_connections"
	nameReconnects  = "qrpc_client_reconnects_total"
	nameEjections   = "qrpc_client_ejections_total"
	nameRetries     = "qrpc_client_retries_total"
	nameBudget      = "qrpc_client_retry_budget_exhausted_total"
	nameBytes       = "qrpc_client_bytes_total"
	nameThrottled   = "qrpc_client_throttled_total"
	namePanics      = "qrpc_client_panics_total"

	// Recorded in Lua by resty.ffi.qrpc.gateway and added to a worker's
	// snapshot there (lua/resty/ffi/qrpc/metrics.lua): rendered here.
	nameGWRequests = "qrpc_gateway_requests_total"
	// Recorded in Lua by resty.ffi.qrpc (a unary whose deadline passed
	// before it was sent).
	nameExpired    = "qrpc_client_deadline_expired_total"
	nameGWDuration = "qrpc_gateway_request_duration_seconds"
	// NameVMCompletions is counted by the built-in host (SetExtraCounters).
	NameVMCompletions = "qrpc_client_vm_completions_total"
)

// family is one metric as the exposition lists it.
type family struct {
	name, typ, help string
}

// families in the order the exposition prints them.
var families = []family{
	{nameCalls, "counter", "Unary call attempts by method, server and result (ok: code 0; code: another code; otherwise the first word of the error)."},
	{nameDuration, "histogram", "Duration of unary call attempts, from start to answer or error, in seconds."},
	{nameEvents, "counter", "One-way events by method, server and result (sent, or dropped when not sent)."},
	{nameInflight, "gauge", "Unary calls in flight."},
	{nameConnections, "gauge", "Servers of pools by state (connecting, up, ejected, draining)."},
	{nameReconnects, "counter", "Connections re-established after a loss."},
	{nameEjections, "counter", "Servers ejected by health checking."},
	{nameRetries, "counter", "Extra attempts of calls by the server whose attempt failed or was slow, and why (the failure's first word, or hedge: a copy sent after the hedge delay)."},
	{nameBudget, "counter", "Retries and hedged copies refused by the retry budget, by the server whose attempt failed or was slow."},
	{nameBytes, "counter", "Frame bytes on the wire by direction (sent, received)."},
	{nameThrottled, "counter", "Calls rejected by a pool's adaptive throttling before any server was asked (unavailable: throttled), by method."},
	{namePanics, "counter", "Panics of the library's goroutines recovered (the worker went on; a call the goroutine held failed with internal error), by the kind of goroutine."},
	{NameVMCompletions, "counter", "Completions (answers, errors, connects) the built-in host delivered to each Lua VM of the worker, by the VM's nginx subsystem (http, stream)."},
	{nameExpired, "counter", "Unary calls not sent because their deadline had passed (timeout, no attempt), by method."},
	{nameGWRequests, "counter", "REST gateway requests by route (its template, never the raw path), HTTP method and status."},
	{nameGWDuration, "histogram", "Duration of REST gateway requests by route, from serve() to the answer written, in seconds."},
}

// Results of a call: ok, code, then the first words of errors with the
// space turned into "_". Anything else is "other".
var results = [...]string{"ok", "code", "timeout", "unavailable", "connection_lost", "closed", "too_large", "queue_full", "connect", "internal_error", "other"}

const (
	resOK = iota
	resCode
	resTimeout
	resUnavailable
	resConnLost
	resClosed
	resTooLarge
	resQueueFull
	resConnect
	resInternal
	resOther
	numResults
)

// Histogram bucket upper bounds, 100 µs to 10 s. bucketBounds holds them
// as durations for the hot path, bucketLabels as the le label values.
var (
	bucketBounds = [...]time.Duration{
		100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
		time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
		10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
	}
	bucketLabels = [...]string{
		"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025",
		"0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf",
	}
)

const numBuckets = len(bucketBounds) + 1 // + Inf

// States reported as qrpc_client_connections; PeerRemoved is not one.
var stateLabels = [...]string{"connecting", "up", "ejected", "draining"}
