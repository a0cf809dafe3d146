// Code generated from internal/schema by make schema; DO NOT EDIT.

package bridge

// The record keys of the ABI's record blocks (internal/schema.WireKeys).
const (
	KeyAddr               uint16 = 1  // CONNECT: a server, host:port or an SRV name (repeatable; replaces cmd.addr)
	KeyBalance            uint16 = 2  // CONNECT: round_robin, least_inflight, hash or p2c
	KeyHealthFailures     uint16 = 3  // CONNECT: failures in a row that eject
	KeyHealthEjectMs      uint16 = 4  // CONNECT: first ejection
	KeyHealthStallMs      uint16 = 5  // CONNECT: stalled-server detection (0: never)
	KeyHealthOn           uint16 = 6  // CONNECT: the failures that eject, a bit set: connect 1, reset 2, timeout 4
	KeyCheckMethod        uint16 = 7  // CONNECT: active health check method
	KeyCheckIntervalMs    uint16 = 8  // CONNECT: active check period
	KeyCheckTimeoutMs     uint16 = 9  // CONNECT: active check timeout
	KeyRetries            uint16 = 10 // CONNECT: default extra attempts on another server
	KeyTryTimeoutMs       uint16 = 11 // CONNECT, UNARY: each attempt's bound (0: off)
	KeyHedgeDelayMs       uint16 = 12 // CONNECT, UNARY: delay before each hedged copy
	KeyHedgeP95           uint16 = 13 // CONNECT, UNARY: 1: hedge after the p95 latency instead of HEDGE_DELAY_MS
	KeyHedgeMax           uint16 = 14 // CONNECT, UNARY: hedged copies besides the first (0: off)
	KeyBudgetRatio        uint16 = 15 // CONNECT: retry budget, share of the calls (0: none)
	KeyBudgetMinPerS      uint16 = 16 // CONNECT: retry budget, reserve per second
	KeyResolveMs          uint16 = 17 // CONNECT: re-resolve names this often (0: once)
	KeyResolver           uint16 = 18 // CONNECT: UDP DNS server, host:port
	KeyStreamBatch        uint16 = 19 // CONNECT: consecutive calls on one stream
	KeyThrottleK          uint16 = 20 // CONNECT: adaptive throttling's K (0: off)
	KeyThrottleCode       uint16 = 21 // CONNECT: a response code that counts as overload (repeatable)
	KeyGomaxprocs         uint16 = 22 // CONFIGURE: the worker's Go Ps
	KeyMetrics            uint16 = 23 // CONFIGURE: 1 records metrics for pools dialled later, 0 does not
	KeySysmon             uint16 = 24 // CONFIGURE answer: lazy or go
	KeyProfileKind        uint16 = 25 // PROFILE: heap, allocs, goroutine, threadcreate, cpu or cpu-stop
	KeyProfileSeconds     uint16 = 26 // PROFILE: a CPU profile's length
	KeyImportPath         uint16 = 27 // PROTO_LOAD, PROTO_DESCRIBE: a directory imports are searched in (repeatable)
	KeyConnections        uint16 = 28 // PEERS of conn 0: the live QUIC connections of every pool
	KeyPeerAddr           uint16 = 29 // PEERS: a server; starts its records
	KeyPeerState          uint16 = 30 // PEERS: up, ejected, connecting, ...
	KeyPeerInflight       uint16 = 31 // PEERS: calls in flight
	KeyPeerCalls          uint16 = 32 // PEERS: calls sent
	KeyPeerFailures       uint16 = 33 // PEERS: failures in a row
	KeyPeerEjectedUntilMs uint16 = 34 // PEERS: end of the ejection, Unix ms (0: not ejected)
	KeyPeerStalled        uint16 = 35 // PEERS: 1 when new calls avoid it as stalled
	KeySampleSeries       uint16 = 36 // METRICS: a sample's series (render: a dict key, a tag before the series allowed)
	KeySampleCounter      uint16 = 37 // METRICS: the value of the series before it, a counter (render: any sample)
	KeySampleGauge        uint16 = 38 // METRICS snapshot: the value of the series before it, a gauge
)

// wireTypes is each key's value type: recStr, recInt or recFloat.
var wireTypes = [...]uint8{
	KeyAddr:               recStr,
	KeyBalance:            recStr,
	KeyHealthFailures:     recInt,
	KeyHealthEjectMs:      recInt,
	KeyHealthStallMs:      recInt,
	KeyHealthOn:           recInt,
	KeyCheckMethod:        recStr,
	KeyCheckIntervalMs:    recInt,
	KeyCheckTimeoutMs:     recInt,
	KeyRetries:            recInt,
	KeyTryTimeoutMs:       recInt,
	KeyHedgeDelayMs:       recInt,
	KeyHedgeP95:           recInt,
	KeyHedgeMax:           recInt,
	KeyBudgetRatio:        recFloat,
	KeyBudgetMinPerS:      recInt,
	KeyResolveMs:          recInt,
	KeyResolver:           recStr,
	KeyStreamBatch:        recInt,
	KeyThrottleK:          recFloat,
	KeyThrottleCode:       recInt,
	KeyGomaxprocs:         recInt,
	KeyMetrics:            recInt,
	KeySysmon:             recStr,
	KeyProfileKind:        recStr,
	KeyProfileSeconds:     recInt,
	KeyImportPath:         recStr,
	KeyConnections:        recInt,
	KeyPeerAddr:           recStr,
	KeyPeerState:          recStr,
	KeyPeerInflight:       recInt,
	KeyPeerCalls:          recInt,
	KeyPeerFailures:       recInt,
	KeyPeerEjectedUntilMs: recInt,
	KeyPeerStalled:        recInt,
	KeySampleSeries:       recStr,
	KeySampleCounter:      recFloat,
	KeySampleGauge:        recFloat,
}
