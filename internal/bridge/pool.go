package bridge

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Every connection of the runtime is a qrpc.Pool: with one address and no
// pool options it behaves as a single client. CONNECT's opts lines
// ("key=value\n") configure it:
//
//	addr=host:port          one per server or name (repeatable); when
//	                        present they replace the v1 addr field
//	balance=round_robin|least_inflight|hash
//	health_failures=N       transport failures in a row that eject (3)
//	health_eject_ms=N       first ejection (10000)
//	health_stall_ms=N       calls in flight and no answer this long: new
//	                        calls go elsewhere (200; 0 = never)
//	check_method=M          active health check method (none)
//	check_interval_ms=N     (2000)
//	check_timeout_ms=N      (500)
//	retries=N               default extra attempts on another server (0)
//	resolve_ms=N            re-resolve names this often (0 = once)
//	resolver=host:port      UDP DNS server instead of the system's
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
			if _, _, e := net.SplitHostPort(val); e != nil || val == "" {
				return Badf("opts: addr %q is not host:port", clipOpt(val))
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
		case "resolve_ms":
			pc.Resolve, err = optMS(key, val)
		case "stream_batch":
			// a connection option, not the pool's: Lua sends it as a line
			// because the command's fixed fields predate it
			pc.StreamBatch, err = optInt(key, val, 1)
			if err == nil && pc.StreamBatch > maxStreams {
				err = Badf("opts: stream_batch must be 1..%d, got %q", maxStreams, clipOpt(val))
			}
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
	if len(addrs) == 0 {
		if len(cmd.Addr) == 0 {
			return nil, nil, Badf("empty address")
		}
		addrs = []string{string(cmd.Addr)}
	}
	return addrs, pc, nil
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
