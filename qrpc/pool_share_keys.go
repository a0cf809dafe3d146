package qrpc

import (
	"hash/fnv"
	"net"
	"slices"
	"strconv"
)

// The keys of a pool, under the prefix the host gives it (its identity,
// or the name the user chose):
//
//	v            version: bumped by every write the others must read
//	g:<addr>     the server's verdict generation (a counter)
//	c:<addr>:<g> the verdict of generation g (written once, by add)
//	f:<addr>:<g> the run of failures in a row since verdict g (a counter)
//	t:<addr>     a view's stall verdict (lapses unless repeated)
//	lp@<s>, ld@<s>  the probe and resolve leases: the holder's view id
//	             and the lease's end (pool_share_tick.go)
//	lpx@<s>:<id>, ldx@<s>:<id>  the token of the view that takes over
//	             the lease of holder id, whose process exited
//	rg@<s>, rl@<s>  the resolved list's generation, and the list
//	tr:<i>, ta:<i>  view slot i's throttling window: requests, accepts
//
// <s> names the pool's configured address list (listScope): pools that
// share one prefix by name may list different servers, and each list
// keeps its own prober, resolver and resolved list, while verdicts, runs
// and stalls, which are per server, and throttling are shared by all.
//
// Every key has a TTL; counters start from the host's monotonic clock in
// ms, so that a counter that expired and came back does not repeat the
// numbers it had. Windows in records are on CLOCK_MONOTONIC, one clock
// for every process of the host (hostNS): a step of the wall clock moves
// none.

// shareKeys are the keys of a view's configured address list (see the
// keys above).
type shareKeys struct {
	lease  [2]string // by lease kind
	token  [2]string // by lease kind, followed by the dead holder's id
	rg, rl string
}

func newShareKeys(scope string) shareKeys {
	return shareKeys{
		lease: [2]string{"lp" + scope, "ld" + scope},
		token: [2]string{"lpx" + scope + ":", "ldx" + scope + ":"},
		rg:    "rg" + scope, rl: "rl" + scope,
	}
}

// listScope names the pool's configured addresses, in any order (see
// ShareScope). Two pools of one name (shared = { dict, name }) with
// different addresses must not adopt each other's resolved list, nor
// leave one list's servers unchecked because a view of the other list
// holds the probe lease.
func (p *Pool) listScope() string {
	addrs := make([]string, len(p.targets))
	for i, t := range p.targets {
		if t.srv {
			addrs[i] = t.host
		} else {
			addrs[i] = net.JoinHostPort(t.host, t.port)
		}
	}
	return ShareScope(addrs)
}

// ShareScope is what the keys of a shared pool's leases and resolved list
// (lp, ld, rg, rl) end with for a pool dialled with addrs (as DialPool
// takes them, in any order): "@" and a hash of the list. For tests and
// tools that read or seed those keys.
func ShareScope(addrs []string) string {
	sorted := slices.Clone(addrs)
	slices.Sort(sorted)
	h := fnv.New64a()
	for _, a := range sorted {
		_, _ = h.Write([]byte(a))
		_, _ = h.Write([]byte{0})
	}
	return "@" + strconv.FormatUint(h.Sum64(), 36)
}
