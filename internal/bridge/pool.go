package bridge

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Every connection of the runtime is a qrpc.Pool: with one address and no
// pool options it behaves as a single client. CONNECT's opts lines
// ("key=value\n") configure it:
//
//	addr=host:port          one per server or name (repeatable); when
//	                        present they replace the v1 addr field; an
//	                        SRV name, _service._proto.name (no port),
//	                        stands for its records' targets, ports,
//	                        priorities and weights
//	balance=round_robin|least_inflight|hash
//	health_failures=N       transport failures in a row that eject (3)
//	health_eject_ms=N       first ejection (10000)
//	health_stall_ms=N       calls in flight and no answer this long: new
//	                        calls go elsewhere (200; 0 = never)
//	check_method=M          active health check method (none)
//	check_interval_ms=N     (2000)
//	check_timeout_ms=N      (500)
//	retries=N               default extra attempts on another server (0)
//	try_timeout_ms=N        each attempt's bound (0 = off)
//	hedge_delay_ms=N|p95    hedge: delay before each copy
//	hedge_max=N             hedge: copies besides the first (0 = off)
//	budget_ratio=F          retry budget: share of the calls (0.2)
//	budget_min_per_s=N      retry budget: reserve per second (10)
//	health_on=a,b,...       failures that eject: connect, reset, timeout
//	resolve_ms=N            re-resolve names this often (0 = once)
//	resolver=host:port      UDP DNS server instead of the system's
//	                        (for SRV names too)
//	throttle_k=F            adaptive throttling's K: 0 = off (default),
//	                        else at least 1 (the SRE book's 2)
//	throttle_codes=a,b,...  response codes that count as overloaded
//	                        (1..4294967295, at most 16; needs throttle_k)
//
// Unknown keys, bad numbers and duplicate addresses are errors.

// maxOptsLen bounds the opts text: a few hundred addresses at most.
const maxOptsLen = 64 << 10

// eachOpt calls f with the key and value of each "key=value" line of opts
// (spaces around a line trimmed, empty lines skipped), after bounding
// opts' length; a line without "=" or f's error ends it.
func eachOpt(opts []byte, f func(key, val string) error) error {
	if len(opts) > maxOptsLen {
		return Badf("opts: %d bytes, at most %d", len(opts), maxOptsLen)
	}
	for _, line := range bytes.Split(opts, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		k, v, ok := bytes.Cut(line, []byte("="))
		if !ok {
			return Badf("opts: %q is not key=value", clipOpt(string(line)))
		}
		if err := f(string(k), string(v)); err != nil {
			return err
		}
	}
	return nil
}

// poolConfig reads CONNECT's opts into the pool's addresses and config;
// base carries the v1 fields (TLS, conns, streams, timeouts).
func poolConfig(cmd *Command, base *qrpc.Config) ([]string, *qrpc.PoolConfig, error) {
	pc := &qrpc.PoolConfig{Config: *base}
	var addrs []string
	seen := map[string]bool{}
	err := eachOpt(cmd.Opts, func(key, val string) error {
		var err error
		switch key {
		case "addr":
			if _, _, e := net.SplitHostPort(val); (e != nil || val == "") && !qrpc.IsSRVName(val) {
				return Badf("opts: addr %q is not host:port or _service._proto.name", clipOpt(val))
			}
			if seen[val] {
				return Badf("opts: duplicate addr %q", clipOpt(val))
			}
			seen[val] = true
			addrs = append(addrs, val)
		case "balance":
			pc.Balance, err = qrpc.ParseBalance(val)
			if err != nil {
				return Badf("opts: unknown balance %q (round_robin, least_inflight or hash)", clipOpt(val))
			}
		case "health_failures":
			pc.Failures, err = optInt(key, val, 1)
		case "health_eject_ms":
			pc.Eject, err = optMS(key, val)
		case "health_stall_ms":
			pc.Stall, err = optMS(key, val)
			if pc.Stall == 0 {
				pc.Stall = -1 // 0 is qrpc's "default"; here it means never
			}
		case "check_method":
			pc.Check.Method = val
		case "check_interval_ms":
			pc.Check.Interval, err = optMS(key, val)
		case "check_timeout_ms":
			pc.Check.Timeout, err = optMS(key, val)
		case "retries":
			pc.Retries, err = optInt(key, val, 0)
			if err == nil && pc.Retries > qrpc.MaxRetries {
				err = Badf("opts: retries must be 0..%d, got %q", qrpc.MaxRetries, clipOpt(val))
			}
		case "try_timeout_ms":
			pc.TryTimeout, err = optMS(key, val)
		case "hedge_delay_ms", "hedge_max":
			err = hedgeOpt(key, val, &pc.Hedge)
		case "budget_ratio":
			var f float64
			f, err = strconv.ParseFloat(val, 64)
			switch {
			case err != nil || f < 0 || f > 1 || f != f:
				err = Badf("opts: budget_ratio must be 0..1, got %q", clipOpt(val))
			case f == 0:
				pc.RetryRatio = -1 // 0 is qrpc's "default"; here it means none
			default:
				pc.RetryRatio = f
			}
		case "budget_min_per_s":
			pc.RetryMinPerS, err = optInt(key, val, 0)
			if err == nil && pc.RetryMinPerS > limits.BudgetMinPerS {
				err = Badf("opts: budget_min_per_s must be 0..%d, got %q", limits.BudgetMinPerS, clipOpt(val))
			}
			if err == nil && pc.RetryMinPerS == 0 {
				pc.RetryMinPerS = -1
			}
		case "health_on":
			pc.EjectOn, err = failureKinds(val)
		case "resolve_ms":
			pc.Resolve, err = optMS(key, val)
		case "stream_batch":
			// a connection option, not the pool's: Lua sends it as a line
			// because the command's fixed fields predate it
			pc.StreamBatch, err = optInt(key, val, 1)
			if err == nil && pc.StreamBatch > maxStreams {
				err = Badf("opts: stream_batch must be 1..%d, got %q", maxStreams, clipOpt(val))
			}
		case "throttle_k":
			var f float64
			f, err = strconv.ParseFloat(val, 64)
			if err != nil || f != f || f < 0 || f > 0 && f < 1 || f > 1e6 {
				return Badf("opts: throttle_k must be 0 or 1..1e6, got %q", clipOpt(val))
			}
			pc.Throttle.K = f
		case "throttle_codes":
			pc.Throttle.Codes, err = throttleCodes(val)
		case "resolver":
			if _, _, e := net.SplitHostPort(val); e != nil {
				return Badf("opts: resolver %q is not host:port", clipOpt(val))
			}
			pc.Resolver = val
		default:
			return Badf("opts: unknown key %q", clipOpt(key))
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

// hedgeOpt reads hedge_delay_ms (milliseconds, or "p95") and hedge_max.
func hedgeOpt(key, val string, h *qrpc.Hedge) error {
	var err error
	switch {
	case key == "hedge_delay_ms" && val == "p95":
		h.P95 = true
	case key == "hedge_delay_ms":
		h.Delay, err = optMS(key, val)
		h.P95 = false
	default:
		h.Max, err = optInt(key, val, 0)
		if err == nil && h.Max > qrpc.MaxHedge {
			err = Badf("opts: hedge_max must be 0..%d, got %q", qrpc.MaxHedge, clipOpt(val))
		}
	}
	return err
}

// throttleCodes reads throttle_codes' comma-separated response codes:
// none, 0 (success) or a repeated code is an error.
func throttleCodes(val string) ([]uint32, error) {
	var out []uint32
	for _, w := range strings.Split(val, ",") {
		n, err := strconv.ParseUint(w, 10, 32)
		if err != nil || n == 0 {
			return nil, Badf("opts: throttle_codes: %q is not a code 1..4294967295", clipOpt(w))
		}
		if slices.Contains(out, uint32(n)) {
			return nil, Badf("opts: throttle_codes: %d twice", n)
		}
		out = append(out, uint32(n))
	}
	if len(out) > qrpc.MaxThrottleCodes {
		return nil, Badf("opts: throttle_codes: at most %d codes, got %d", qrpc.MaxThrottleCodes, len(out))
	}
	return out, nil
}

// failureKinds reads health_on's comma-separated kinds; none is an error
// (a pool that never ejects says health.failures instead).
func failureKinds(val string) (qrpc.Failure, error) {
	var f qrpc.Failure
	for _, w := range strings.Split(val, ",") {
		switch w {
		case "connect":
			f |= qrpc.FailConnect
		case "reset":
			f |= qrpc.FailReset
		case "timeout":
			f |= qrpc.FailTimeout
		default:
			return 0, Badf("opts: health_on: unknown failure %q (connect, reset, timeout)", clipOpt(w))
		}
	}
	return f, nil
}

// callOpts reads UNARY's opts lines, the per-call options that override
// the pool's: try_timeout_ms, hedge_delay_ms, hedge_max (0 turns each
// off for this call).
func callOpts(opts []byte, call *qrpc.Call) error {
	var h qrpc.Hedge
	hedged := false
	err := eachOpt(opts, func(key, val string) error {
		switch key {
		case "try_timeout_ms":
			d, err := optMS(key, val)
			if err != nil {
				return err
			}
			call.TryTimeout = d
			if d == 0 {
				call.TryTimeout = -1
			}
			return nil
		case "hedge_delay_ms", "hedge_max":
			hedged = true
			return hedgeOpt(key, val, &h)
		}
		return Badf("opts: unknown call option %q", clipOpt(key))
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

func optInt(key, val string, least int) (int, error) {
	n, err := strconv.Atoi(val)
	if err != nil || n < least || n > 1<<30 {
		return 0, Badf("opts: %s must be an integer >= %d, got %q", key, least, clipOpt(val))
	}
	return n, nil
}

func optMS(key, val string) (time.Duration, error) {
	n, err := optInt(key, val, 0)
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

// Peers answers QRPC_OP_PEERS: one line per server of connection h,
// "addr=... state=... inflight=N calls=N failures=N ejected_until=MS stalled=0|1\n",
// ejected_until in Unix milliseconds (0 when not ejected).
func (r *Runtime) Peers(h uint64) ([]byte, error) {
	c := r.lookup(h)
	if c == nil {
		return nil, qrpc.ErrClosed
	}
	var b strings.Builder
	for _, p := range c.client.Peers() {
		var until int64
		if !p.EjectedUntil.IsZero() {
			until = p.EjectedUntil.UnixMilli()
		}
		stalled := 0
		if p.Stalled {
			stalled = 1
		}
		fmt.Fprintf(&b, "addr=%s state=%s inflight=%d calls=%d failures=%d ejected_until=%d stalled=%d\n",
			p.Addr, p.State, p.Inflight, p.Calls, p.Failures, until, stalled)
	}
	return []byte(b.String()), nil
}

func init() {
	RegisterQuery(OpPeers, func(r *Runtime, cmd *Command) ([]byte, error) {
		if cmd.Conn == 0 {
			return fmt.Appendf(nil, "connections=%d\n", r.QUICConns()), nil
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
