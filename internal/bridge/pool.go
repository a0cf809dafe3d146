package bridge

import (
	"math"
	"net"
	"slices"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Every connection of the runtime is a qrpc.Pool: with one address and no
// pool options it behaves as a single client. CONNECT's opts block (the
// records of wire.go, keys in wire_keys.go) configures it: ADDR records
// (one per server or name; an SRV name, _service._proto.name without a
// port, stands for its records) replace the addr field; the others set
// the pool's balance, health, active check, retries, hedging, budget,
// re-resolution, resolver, stream batch and throttling. Lua checks every
// value against the schema first; the checks here keep a malformed
// command from reaching qrpc. Unknown keys, values out of bounds and
// duplicate addresses are errors.

// poolConfig reads CONNECT's opts into the pool's addresses and config;
// base carries the fixed fields (TLS, conns, streams, timeouts).
func poolConfig(cmd *Command, base *qrpc.Config) ([]string, *qrpc.PoolConfig, error) {
	pc := &qrpc.PoolConfig{Config: *base}
	var addrs []string
	seen := map[string]bool{}
	err := eachRec(cmd.Opts, func(r Rec) error {
		var err error
		switch r.Key {
		case KeyAddr:
			val := r.Str()
			if _, _, e := net.SplitHostPort(val); (e != nil || val == "") && !qrpc.IsSRVName(val) {
				return Badf("opts: addr %q is not host:port or _service._proto.name", clipOpt(val))
			}
			if seen[val] {
				return Badf("opts: duplicate addr %q", clipOpt(val))
			}
			seen[val] = true
			addrs = append(addrs, val)
		case KeyBalance:
			pc.Balance, err = qrpc.ParseBalance(r.Str())
			if err != nil {
				return Badf("opts: unknown balance %q (round_robin, least_inflight, hash or p2c)", clipOpt(r.Str()))
			}
		case KeyHealthFailures:
			pc.Failures, err = optInt("health_failures", r, 1, 1<<30)
		case KeyHealthEjectMs:
			pc.Eject, err = optMS("health_eject_ms", r)
		case KeyHealthStallMs:
			pc.Stall, err = optMS("health_stall_ms", r)
			if pc.Stall == 0 {
				pc.Stall = -1 // 0 is qrpc's "default"; here it means never
			}
		case KeyCheckMethod:
			pc.Check.Method = r.Str()
		case KeyCheckIntervalMs:
			pc.Check.Interval, err = optMS("check_interval_ms", r)
		case KeyCheckTimeoutMs:
			pc.Check.Timeout, err = optMS("check_timeout_ms", r)
		case KeyRetries:
			pc.Retries, err = optInt("retries", r, 0, qrpc.MaxRetries)
		case KeyTryTimeoutMs:
			pc.TryTimeout, err = optMS("try_timeout_ms", r)
		case KeyHedgeDelayMs, KeyHedgeP95, KeyHedgeMax:
			err = hedgeOpt(r, &pc.Hedge)
		case KeyBudgetRatio:
			f := r.Float()
			switch {
			case !(f >= 0 && f <= 1):
				err = Badf("opts: budget_ratio must be 0..1, got %v", f)
			case f == 0:
				pc.RetryRatio = -1 // 0 is qrpc's "default"; here it means none
			default:
				pc.RetryRatio = f
			}
		case KeyBudgetMinPerS:
			pc.RetryMinPerS, err = optInt("budget_min_per_s", r, 0, limits.BudgetMinPerS)
			if err == nil && pc.RetryMinPerS == 0 {
				pc.RetryMinPerS = -1
			}
		case KeyHealthOn:
			n := r.Int()
			if n <= 0 || n > int64(qrpc.FailConnect|qrpc.FailReset|qrpc.FailTimeout) {
				return Badf("opts: health_on: %d is not a non-empty set of connect 1, reset 2, timeout 4", n)
			}
			pc.EjectOn = qrpc.Failure(n)
		case KeyResolveMs:
			pc.Resolve, err = optMS("resolve_ms", r)
		case KeyStreamBatch:
			// a connection option, not the pool's: a record because the
			// command's fixed fields predate it
			pc.StreamBatch, err = optInt("stream_batch", r, 1, maxStreams)
		case KeyThrottleK:
			f := r.Float()
			if !(f == 0 || f >= 1 && f <= 1e6) {
				return Badf("opts: throttle_k must be 0 or 1..1e6, got %v", f)
			}
			pc.Throttle.K = f
		case KeyThrottleCode:
			n := r.Int()
			if n < 1 || n > math.MaxUint32 {
				return Badf("opts: throttle_codes: %d is not a code 1..4294967295", n)
			}
			if slices.Contains(pc.Throttle.Codes, uint32(n)) {
				return Badf("opts: throttle_codes: %d twice", n)
			}
			if len(pc.Throttle.Codes) == qrpc.MaxThrottleCodes {
				return Badf("opts: throttle_codes: at most %d codes", qrpc.MaxThrottleCodes)
			}
			pc.Throttle.Codes = append(pc.Throttle.Codes, uint32(n))
		case KeyResolver:
			val := r.Str()
			if _, _, e := net.SplitHostPort(val); e != nil {
				return Badf("opts: resolver %q is not host:port", clipOpt(val))
			}
			pc.Resolver = val
		default:
			return Badf("opts: record %d is not a CONNECT option", r.Key)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if len(pc.Throttle.Codes) > 0 && pc.Throttle.K == 0 {
		return nil, nil, Badf("opts: throttle_codes needs throttle_k")
	}
	if len(addrs) == 0 {
		if len(cmd.Addr) == 0 {
			return nil, nil, Badf("empty address")
		}
		addrs = []string{string(cmd.Addr)}
	}
	return addrs, pc, nil
}

// hedgeOpt reads HEDGE_DELAY_MS, HEDGE_P95 (1: hedge after the p95
// latency) and HEDGE_MAX.
func hedgeOpt(r Rec, h *qrpc.Hedge) error {
	var err error
	switch r.Key {
	case KeyHedgeP95:
		if r.Int() != 1 {
			return Badf("opts: hedge_p95 must be 1, got %d", r.Int())
		}
		h.P95 = true
	case KeyHedgeDelayMs:
		h.Delay, err = optMS("hedge_delay_ms", r)
		h.P95 = false
	default:
		h.Max, err = optInt("hedge_max", r, 0, qrpc.MaxHedge)
	}
	return err
}

// callOpts reads UNARY's opts block, the per-call options that override
// the pool's: TRY_TIMEOUT_MS, HEDGE_DELAY_MS or HEDGE_P95, HEDGE_MAX (0
// turns each off for this call).
func callOpts(opts []byte, call *qrpc.Call) error {
	var h qrpc.Hedge
	hedged := false
	err := eachRec(opts, func(r Rec) error {
		switch r.Key {
		case KeyTryTimeoutMs:
			d, err := optMS("try_timeout_ms", r)
			if err != nil {
				return err
			}
			call.TryTimeout = d
			if d == 0 {
				call.TryTimeout = -1
			}
			return nil
		case KeyHedgeDelayMs, KeyHedgeP95, KeyHedgeMax:
			hedged = true
			return hedgeOpt(r, &h)
		}
		return Badf("opts: record %d is not a call option", r.Key)
	})
	if err != nil {
		return err
	}
	if hedged {
		if h.Max == 0 {
			h.Max = -1
		}
		call.Hedge = h
	}
	return nil
}

// optInt reads an int record that must lie in least..most.
func optInt(name string, r Rec, least, most int64) (int, error) {
	n := r.Int()
	if n < least || n > most {
		return 0, Badf("opts: %s must be an integer %d..%d, got %d", name, least, most, n)
	}
	return int(n), nil
}

func optMS(name string, r Rec) (time.Duration, error) {
	n, err := optInt(name, r, 0, 1<<30)
	return time.Duration(n) * time.Millisecond, err
}

// callRetries maps a command's retries (0 = none: Lua sends the effective
// value, its own per-call option or the connection's) to Call.Retries.
func callRetries(n int32) int {
	if n <= 0 {
		return -1
	}
	return int(n)
}

// Peers answers QRPC_OP_PEERS: a record block, per server of connection
// h a PEER_ADDR record then its PEER_STATE, PEER_INFLIGHT, PEER_CALLS,
// PEER_FAILURES, PEER_EJECTED_UNTIL_MS (Unix ms, 0 when not ejected) and
// PEER_STALLED (0 or 1).
func (r *Runtime) Peers(h uint64) ([]byte, error) {
	c := r.lookup(h)
	if c == nil {
		return nil, qrpc.ErrClosed
	}
	var b []byte
	for _, p := range c.client.Peers() {
		var until int64
		if !p.EjectedUntil.IsZero() {
			until = p.EjectedUntil.UnixMilli()
		}
		var stalled int64
		if p.Stalled {
			stalled = 1
		}
		b = AppendStr(b, KeyPeerAddr, p.Addr)
		b = AppendStr(b, KeyPeerState, p.State.String())
		b = AppendInt(b, KeyPeerInflight, int64(p.Inflight))
		b = AppendInt(b, KeyPeerCalls, int64(p.Calls))
		b = AppendInt(b, KeyPeerFailures, int64(p.Failures))
		b = AppendInt(b, KeyPeerEjectedUntilMs, until)
		b = AppendInt(b, KeyPeerStalled, stalled)
	}
	return b, nil
}

func init() {
	RegisterQuery(OpPeers, func(r *Runtime, cmd *Command) ([]byte, error) {
		if cmd.Conn == 0 {
			return AppendInt(nil, KeyConnections, int64(r.QUICConns())), nil
		}
		return r.Peers(cmd.Conn)
	})
}

// QUICConns counts the live QUIC connections of every pool in the table,
// for qrpc.stats().connections.
func (r *Runtime) QUICConns() int {
	n := 0
	for _, c := range *r.conns.Load() {
		n += c.client.Conns()
	}
	return n
}

// clipOpt keeps an echoed option value short in an error message.
func clipOpt(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
