package schema

import (
	"fmt"
	"go/format"
	"slices"
	"strings"
)

// The record block: how options go into the library (qrpc_cmd_t.opts) and
// how the answers of the query ops come out. A block is a run of records,
// each
//
//	[uint16 key][uint32 length][length bytes of value]
//
// native-endian like the rest of the ABI (the library and nginx share a
// process), unaligned. A value is a string's bytes, an int64 or a float64
// (8 bytes): the key's type says which. A key the reader does not know, a
// number whose length is not 8 and a block that ends inside a record are
// malformed. Keys are numbered here once; make schema writes them into
// lua/resty/ffi/qrpc/wire.lua and internal/bridge/wire_keys.go.
//
// Adding a record is one entry at the end (numbers are never reused: a
// library and a Lua tree of the same interface version agree on them).

// Value types of a record.
const (
	Str   = "str"
	Int   = "int"
	Float = "float"
)

// WireKey is one record key.
type WireKey struct {
	ID   uint16
	Name string // Lua: wire.NAME; Go: Key + CamelCase(Name)
	Type string
	Doc  string
}

// WireKeys lists every record key, by the command or answer it belongs to.
var WireKeys = []WireKey{
	// CONNECT: the pool of a connection.
	{1, "ADDR", Str, "CONNECT: a server, host:port or an SRV name (repeatable; replaces cmd.addr)"},
	{2, "BALANCE", Str, "CONNECT: round_robin, least_inflight, hash or p2c"},
	{3, "HEALTH_FAILURES", Int, "CONNECT: failures in a row that eject"},
	{4, "HEALTH_EJECT_MS", Int, "CONNECT: first ejection"},
	{5, "HEALTH_STALL_MS", Int, "CONNECT: stalled-server detection (0: never)"},
	{6, "HEALTH_ON", Int, "CONNECT: the failures that eject, a bit set: connect 1, reset 2, timeout 4"},
	{7, "CHECK_METHOD", Str, "CONNECT: active health check method"},
	{8, "CHECK_INTERVAL_MS", Int, "CONNECT: active check period"},
	{9, "CHECK_TIMEOUT_MS", Int, "CONNECT: active check timeout"},
	{10, "RETRIES", Int, "CONNECT: default extra attempts on another server"},
	{11, "TRY_TIMEOUT_MS", Int, "CONNECT, UNARY: each attempt's bound (0: off)"},
	{12, "HEDGE_DELAY_MS", Int, "CONNECT, UNARY: delay before each hedged copy"},
	{13, "HEDGE_P95", Int, "CONNECT, UNARY: 1: hedge after the p95 latency instead of HEDGE_DELAY_MS"},
	{14, "HEDGE_MAX", Int, "CONNECT, UNARY: hedged copies besides the first (0: off)"},
	{15, "BUDGET_RATIO", Float, "CONNECT: retry budget, share of the calls (0: none)"},
	{16, "BUDGET_MIN_PER_S", Int, "CONNECT: retry budget, reserve per second"},
	{17, "RESOLVE_MS", Int, "CONNECT: re-resolve names this often (0: once)"},
	{18, "RESOLVER", Str, "CONNECT: UDP DNS server, host:port"},
	{19, "STREAM_BATCH", Int, "CONNECT: consecutive calls on one stream"},
	{20, "THROTTLE_K", Float, "CONNECT: adaptive throttling's K (0: off)"},
	{21, "THROTTLE_CODE", Int, "CONNECT: a response code that counts as overload (repeatable)"},
	// CONFIGURE: asked and answered.
	{22, "GOMAXPROCS", Int, "CONFIGURE: the worker's Go Ps"},
	{23, "METRICS", Int, "CONFIGURE: 1 records metrics for pools dialled later, 0 does not"},
	{24, "SYSMON", Str, "CONFIGURE answer: lazy or go"},
	// PROFILE.
	{25, "PROFILE_KIND", Str, "PROFILE: heap, allocs, goroutine, threadcreate, cpu or cpu-stop"},
	{26, "PROFILE_SECONDS", Int, "PROFILE: a CPU profile's length"},
	// PROTO_LOAD, PROTO_DESCRIBE.
	{27, "IMPORT_PATH", Str, "PROTO_LOAD, PROTO_DESCRIBE: a directory imports are searched in (repeatable)"},
	// PEERS answers.
	{28, "CONNECTIONS", Int, "PEERS of conn 0: the live QUIC connections of every pool"},
	{29, "PEER_ADDR", Str, "PEERS: a server; starts its records"},
	{30, "PEER_STATE", Str, "PEERS: up, ejected, connecting, ..."},
	{31, "PEER_INFLIGHT", Int, "PEERS: calls in flight"},
	{32, "PEER_CALLS", Int, "PEERS: calls sent"},
	{33, "PEER_FAILURES", Int, "PEERS: failures in a row"},
	{34, "PEER_EJECTED_UNTIL_MS", Int, "PEERS: end of the ejection, Unix ms (0: not ejected)"},
	{35, "PEER_STALLED", Int, "PEERS: 1 when new calls avoid it as stalled"},
	// METRICS snapshot answers and render input: one sample is a series
	// record, then its value.
	{36, "SAMPLE_SERIES", Str, "METRICS: a sample's series (render: a dict key, a tag before the series allowed)"},
	{37, "SAMPLE_COUNTER", Float, "METRICS: the value of the series before it, a counter (render: any sample)"},
	{38, "SAMPLE_GAUGE", Float, "METRICS snapshot: the value of the series before it, a gauge"},
}

// Ops are the commands or answers a key belongs to, as its Doc begins
// ("CONNECT, UNARY: ..." -> CONNECT, UNARY).
func (k WireKey) Ops() []string {
	head, _, _ := strings.Cut(k.Doc, ":")
	return strings.Split(head, ", ")
}

// OptionOps are the commands whose opts carry the options of each place.
var OptionOps = map[string]string{Connect: "CONNECT", Call: "UNARY", Method: "UNARY", Event: "EVENT"}

// WireKeyNamed is the record key called name, or false.
func WireKeyNamed(name string) (WireKey, bool) {
	for _, k := range WireKeys {
		if k.Name == name {
			return k, true
		}
	}
	return WireKey{}, false
}

// RecordsAt are the record keys that carry option o at place where: those
// of o.Wire that the place's command reads.
func RecordsAt(o Option, where string) []WireKey {
	var out []WireKey
	for _, w := range o.Wire {
		k, ok := WireKeyNamed(w)
		if ok && slices.Contains(k.Ops(), OptionOps[where]) {
			out = append(out, k)
		}
	}
	return out
}

// CheckWire returns what disagrees between options and record keys (make
// lint runs it through gen -check): every option of connect, a call, an
// event or a methods entry says how it reaches the library (records that
// exist, a fixed field or Lua); where an option is accepted, a record it
// names belongs to that place's command, or another way is named too; and
// every record of CONNECT and UNARY but ADDR (connect's addr argument)
// carries some option. That Lua writes and Go reads each option under
// these keys, TestWireOfOptions (nginx) and TestOptionRecordsDecoded
// (internal/bridge) check.
func CheckWire(opts []Option) []string {
	var errs []string
	named := map[string]bool{}
	parents := map[string]bool{}
	for _, o := range opts {
		if top, _, ok := strings.Cut(o.Name, "."); ok {
			parents[top] = true
		}
	}
	for _, o := range opts {
		// a table whose fields are options carries nothing itself
		parent := o.Type == "table" && parents[o.Name]
		place := false
		for _, w := range o.Where {
			place = place || OptionOps[w] != ""
		}
		if !place {
			if len(o.Wire) != 0 {
				errs = append(errs, o.Name+": Wire, but not an option of a command")
			}
			continue
		}
		if len(o.Wire) == 0 && !parent {
			errs = append(errs, o.Name+": no Wire: name its record keys, InCmd or InLua")
		}
		other := parent
		for _, w := range o.Wire {
			if w == InCmd || w == InLua {
				other = true
				continue
			}
			if _, ok := WireKeyNamed(w); !ok {
				errs = append(errs, fmt.Sprintf("%s: Wire %q is no record key", o.Name, w))
			}
			named[w] = true
		}
		for _, w := range o.Where {
			if OptionOps[w] != "" && len(o.Wire) > 0 && len(RecordsAt(o, w)) == 0 && !other {
				errs = append(errs, fmt.Sprintf("%s: accepted at %s, but none of its records %v is read by %s", o.Name, w, o.Wire, OptionOps[w]))
			}
		}
	}
	for _, k := range WireKeys {
		for _, op := range k.Ops() {
			if (op == "CONNECT" || op == "UNARY") && k.Name != "ADDR" && !named[k.Name] {
				errs = append(errs, fmt.Sprintf("record %s (%s) carries no option: name it in an option's Wire", k.Name, op))
			}
		}
	}
	return errs
}

// WireLuaPath and WireGoPath are where the generated key tables live.
const (
	WireLuaPath = "lua/resty/ffi/qrpc/wire_keys.lua"
	WireGoPath  = "internal/bridge/wire_keys.go"
)

func camel(s string) string {
	var b strings.Builder
	for _, w := range strings.Split(strings.ToLower(s), "_") {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

// WireLuaSource is wire_keys.lua as make schema writes it.
func WireLuaSource() []byte {
	var b strings.Builder
	b.WriteString(`-- resty.ffi.qrpc.wire_keys: the record keys of the ABI's record blocks
-- (qrpc_cmd_t.opts, the query ops' answers). Generated from
-- internal/schema by "make schema": do not edit (make lint fails when the
-- two differ). NAME = id, and by id: names[id], types[id] ("str", "int",
-- "float").
-- luacheck: no max line length

local names, types = {}, {}
local _M = { names = names, types = types }

`)
	for _, k := range WireKeys {
		fmt.Fprintf(&b, "_M.%s = %d; names[%d] = %q; types[%d] = %q  -- %s\n", k.Name, k.ID, k.ID, k.Name, k.ID, k.Type, k.Doc)
	}
	b.WriteString("\nreturn _M\n")
	return []byte(b.String())
}

// WireGoSource is wire_keys.go as make schema writes it.
func WireGoSource() []byte {
	var b strings.Builder
	b.WriteString("// Code generated from internal/schema by make schema; DO NOT EDIT.\n\npackage bridge\n\n")
	b.WriteString("// The record keys of the ABI's record blocks (internal/schema.WireKeys).\nconst (\n")
	for _, k := range WireKeys {
		fmt.Fprintf(&b, "\tKey%s uint16 = %d // %s\n", camel(k.Name), k.ID, k.Doc)
	}
	b.WriteString(")\n\n// wireTypes is each key's value type: recStr, recInt or recFloat.\nvar wireTypes = [...]uint8{\n")
	for _, k := range WireKeys {
		t := map[string]string{Str: "recStr", Int: "recInt", Float: "recFloat"}[k.Type]
		fmt.Fprintf(&b, "\tKey%s: %s,\n", camel(k.Name), t)
	}
	b.WriteString("}\n")
	src, err := format.Source([]byte(b.String()))
	if err != nil {
		panic(err)
	}
	return src
}
