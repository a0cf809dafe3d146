// Package schema describes every numeric and typed option of the public
// Lua API once: its name, type, default, unit, bounds, where it is
// accepted, whether it is part of what picks a cached connection, and a
// one-line doc. lua/resty/ffi/qrpc/schema.lua is generated from it (make
// schema; make lint fails when it is stale); the bounds come from
// internal/limits and the connection defaults from limits.Defaults (which
// make lint compares with Go's qrpc.Config), so no bound or default is
// written twice. nginx/schema_contract_test.go passes each option's
// default, bounds and the values past them through nginx and checks the
// answer the schema promises.
//
// Adding an option is one entry here (and its check in Lua, which the
// contract test then holds to this entry).
package schema

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
)

// Where an option is accepted.
const (
	Connect   = "connect"   // qrpc.connect's opts (argument #2)
	Call      = "call"      // conn:unary's opts (argument #4)
	Event     = "event"     // conn:event's opts too
	Method    = "method"    // connect's methods.<Name>
	Configure = "configure" // qrpc.configure (argument #1)
)

// How an option that is no record reaches the library (Option.Wire).
const (
	InCmd = "cmd" // a fixed field of qrpc_cmd_t
	InLua = "lua" // Lua keeps it: it changes what Lua sends, not a field
)

// Option is one option of the API.
type Option struct {
	Name    string   // as written by a caller; nested ones as "health.eject"
	Type    string   // "integer", "number", "string", "boolean", "table", "list"
	Default string   // as Lua writes it; "" for none
	Unit    string   // "ms", "bytes" or ""
	Min     *float64 // lowest value accepted (numbers)
	MinOpen bool     // Min itself is refused (> Min)
	Max     *float64 // highest value accepted (numbers)
	Where   []string
	Key     bool   // part of the connection cache's key
	Needs   string // another option that must be given with this one
	// Wire says how the option reaches the library: the record keys
	// (WireKeys names) that carry it in a command's opts block, InCmd for
	// a fixed field of qrpc_cmd_t, InLua for one Lua keeps. Several
	// entries where places differ (retries: a record at connect, a field
	// per call). A table whose fields are options of their own (health,
	// hedge, ...) carries nothing itself. TestWireOfOptions (nginx) holds
	// Lua's encoder to it, TestOptionRecordsDecoded (internal/bridge) Go's
	// decoder.
	Wire []string
	Doc  string
	// For docs/api.md's tables: the type, default and bounds as a reader
	// wants them where the fields above do not say it all.
	DocType, DocDefault, DocBounds string
}

func f(v int64) *float64    { x := float64(v); return &x }
func ff(v float64) *float64 { return &v }
func def(name string) string {
	for _, d := range limits.Defaults {
		if d.Name == name {
			return strconv.FormatInt(d.Value, 10)
		}
	}
	panic("no default " + name)
}

// Options lists them.
var Options = []Option{
	{Name: "server_name", Type: "string", Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "SNI and the name the certificate must carry", DocDefault: "the host of `addr`", DocBounds: "not `\"\"`"},
	{Name: "ca", Type: "string", Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "PEM of the CA certificates to trust", DocDefault: "the system roots", DocBounds: "not `\"\"`"},
	{Name: "cert", Type: "string", Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "PEM of the client certificate", DocBounds: "with `key`, not `\"\"`"},
	{Name: "key", Type: "string", Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "PEM of the client key", DocBounds: "with `cert`, not `\"\"`"},
	{Name: "pins", Type: "list", Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "SHA-256 digests of the server's SPKI", DocType: "list of strings", DocBounds: "64 hex digits or base64"},
	{Name: "insecure", Type: "boolean", Default: "false", Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "skip certificate verification"},
	{Name: "conns", Type: "integer", Default: def("DEFAULT_CONNS"), Min: f(1), Max: f(limits.Conns), Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "QUIC connections per server"},
	{Name: "streams", Type: "integer", Default: def("DEFAULT_STREAMS"), Min: f(1), Max: f(limits.Streams), Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "streams per connection"},
	{Name: "stream_batch", Type: "integer", Default: def("DEFAULT_STREAM_BATCH"), Min: f(1), Max: f(limits.StreamBatch), Where: []string{Connect}, Key: true, Wire: []string{"STREAM_BATCH"}, Doc: "consecutive calls on one stream"},
	{Name: "timeout", Type: "number", Default: def("DEFAULT_TIMEOUT_MS"), Unit: "ms", Min: f(0), Max: f(limits.MS), Where: []string{Connect, Call}, Key: true, Wire: []string{InCmd}, Doc: "connect: the dial's timeout and the calls' default; per call (unary only): this call's, default the connection's", DocBounds: "`0`: the default"},
	{Name: "idle_timeout", Type: "number", Default: def("DEFAULT_IDLE_TIMEOUT_MS"), Unit: "ms", Min: f(0), Max: f(limits.MS), Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "close a connection whose server is silent (after about 1.5 × this: see below)", DocBounds: "`0`: the default"},
	{Name: "max_frame_size", Type: "integer", Default: def("DEFAULT_MAX_FRAME_SIZE"), Unit: "bytes", Min: f(limits.MinFrameSize), Max: f(limits.MaxFrameSize), Where: []string{Connect}, Key: true, Wire: []string{InCmd}, Doc: "largest frame either way"},
	{Name: "deadline", Type: "number", Unit: "s", Where: []string{Call}, Wire: []string{InLua}, Doc: "the call's absolute deadline, in ngx.now()'s seconds: it bounds timeout, and a call past it is not sent (timeout, no attempt; unary only)", DocDefault: "none"},
	{Name: "propagate_deadline", Type: "boolean", Default: "false", Where: []string{Connect, Call}, Key: true, Wire: []string{InLua}, Doc: "send the time left to the server as the header grpc-timeout (gRPC's format: whole ms rounded up, e.g. 987m, whole seconds from 10^8 ms; it replaces a grpc-timeout of the call's headers; unary only)"},
	{Name: "propagate", Type: "list", Where: []string{Connect}, Key: true, Wire: []string{InLua}, Doc: "request headers copied into every call", DocType: "list of strings"},
	{Name: "methods", Type: "table", Where: []string{Connect}, Wire: []string{InLua}, Doc: "per method name: `request`, `response`, `json`, `discard_unknown`, `proto_names`, `emit_unpopulated`, `hedge`, `try_timeout`; connect returns an object of its own for each `methods` table"},
	{Name: "balance", Type: "string", Default: `"round_robin"`, Where: []string{Connect}, Key: true, Wire: []string{"BALANCE"}, Doc: "how a pool picks a server", DocBounds: "`\"round_robin\"`, `\"least_inflight\"`, `\"hash\"`, `\"p2c\"`"},
	{Name: "health", Type: "table", Where: []string{Connect}, Key: true, Doc: "passive health: failures, eject, stall, on", DocDefault: "the defaults of its fields"},
	{Name: "health.on", Type: "list", Where: []string{Connect}, Key: true, Wire: []string{"HEALTH_ON"}, Doc: "the failures that count towards health.failures", DocType: "list of strings", DocDefault: "`{ \"connect\", \"reset\", \"timeout\" }`", DocBounds: "a non-empty subset"},
	{Name: "health.failures", Type: "integer", Default: "3", Min: f(1), Max: f(limits.MS), Where: []string{Connect}, Key: true, Wire: []string{"HEALTH_FAILURES"}, Doc: "failures in a row that eject a server"},
	{Name: "health.eject", Type: "number", Default: "10000", Unit: "ms", Min: f(0), MinOpen: true, Max: f(limits.MS), Where: []string{Connect}, Key: true, Wire: []string{"HEALTH_EJECT_MS"}, Doc: "how long a server stays ejected"},
	{Name: "health.stall", Type: "number", Default: "200", Unit: "ms", Min: f(0), Max: f(limits.MS), Where: []string{Connect}, Key: true, Wire: []string{"HEALTH_STALL_MS"}, Doc: "stalled-server detection", DocBounds: "`0`: off"},
	{Name: "check", Type: "table", Where: []string{Connect}, Key: true, Doc: "active health check: method, interval, timeout", DocDefault: "none (no check)"},
	{Name: "check.method", Type: "string", Where: []string{Connect}, Key: true, Wire: []string{"CHECK_METHOD"}, Doc: "the method active checks call", DocDefault: "required with `check`"},
	{Name: "check.interval", Type: "number", Default: "2000", Unit: "ms", Min: f(0), MinOpen: true, Max: f(limits.MS), Where: []string{Connect}, Key: true, Needs: "check.method", Wire: []string{"CHECK_INTERVAL_MS"}, Doc: "active check period"},
	{Name: "check.timeout", Type: "number", Default: "500", Unit: "ms", Min: f(0), MinOpen: true, Max: f(limits.MS), Where: []string{Connect}, Key: true, Needs: "check.method", Wire: []string{"CHECK_TIMEOUT_MS"}, Doc: "active check timeout"},
	{Name: "retries", Type: "integer", Default: "0", Min: f(0), Max: f(limits.Retries), Where: []string{Connect, Call}, Key: true, Wire: []string{"RETRIES", InCmd}, Doc: "extra attempts, on another server when one can take it (else on the same one); per call (unary only), default the connection's"},
	{Name: "try_timeout", Type: "number", Default: "0", Unit: "ms", Min: f(0), Max: f(limits.MS), Where: []string{Connect, Call, Method}, Key: true, Wire: []string{"TRY_TIMEOUT_MS"}, Doc: "each attempt's bound; per call (unary only) or per method, default the method's, else the connection's", DocBounds: "`0`: off"},
	{Name: "hedge", Type: "table", Where: []string{Connect, Call, Method}, Key: true, Doc: "hedged copies: delay, max; per call `false`: none (unary only)", DocType: "table (per call: or `false`)"},
	{Name: "budget", Type: "table", Where: []string{Connect}, Key: true, Doc: "the retry budget: ratio, min_per_s", DocDefault: "`{ ratio = 0.2, min_per_s = 10 }`"},
	{Name: "throttle", Type: "table", Where: []string{Connect}, Key: true, Wire: []string{"THROTTLE_K", "THROTTLE_CODE"}, Doc: "adaptive throttling: `k` (0 off, or 1..1000000), `codes` (the answer codes that count as overload, at most 16)", DocDefault: "off"},
	{Name: "hedge.delay", Type: "number", Unit: "ms", Min: f(0), Max: f(limits.MS), Where: []string{Connect, Call, Method}, Key: true, Wire: []string{"HEDGE_DELAY_MS", "HEDGE_P95"}, Doc: `when a copy goes out`, DocType: `number or "p95"`, DocDefault: "required with `hedge`"},
	{Name: "hedge.max", Type: "integer", Default: "1", Min: f(1), Max: f(limits.Hedge), Where: []string{Connect, Call, Method}, Key: true, Needs: "hedge.delay", Wire: []string{"HEDGE_MAX"}, Doc: "copies at most"},
	{Name: "budget.ratio", Type: "number", Default: "0.2", Min: ff(0), Max: ff(1), Where: []string{Connect}, Key: true, Wire: []string{"BUDGET_RATIO"}, Doc: "share of the calls retries and copies may add"},
	{Name: "budget.min_per_s", Type: "integer", Default: "10", Min: f(0), Max: f(limits.BudgetMinPerS), Where: []string{Connect}, Key: true, Wire: []string{"BUDGET_MIN_PER_S"}, Doc: "retries and copies always allowed per second"},
	{Name: "resolve", Type: "number", Default: "0", Unit: "ms", Min: f(0), Max: f(limits.MS), Where: []string{Connect}, Key: true, Wire: []string{"RESOLVE_MS"}, Doc: "re-resolution period", DocBounds: "`0`: resolved once"},
	{Name: "shared", Type: "string", Where: []string{Connect}, Key: true, Wire: []string{InLua}, Doc: "lua_shared_dict through which the workers of the instance share the pool's verdicts (ejections, stalls), its active checks and its re-resolution (one worker runs them); `{ dict = <name>, name = <pool name> }` names the pool's keys in it (pools of the same name share, whatever their options; each configured address list keeps its own prober, resolver and resolved list); `false`: not shared, whatever `pools_dict` says", DocType: "string (`lua_shared_dict` name), `{ dict =, name = }` or `false`", DocDefault: "configure's `pools_dict`, else none", DocBounds: "an existing dict"},
	{Name: "resolver", Type: "string", Where: []string{Connect}, Key: true, Wire: []string{"RESOLVER"}, Doc: "DNS server to ask (UDP; TCP for a truncated answer)", DocDefault: "the system's", DocBounds: "`\"host:port\"`"},
	{Name: "headers", Type: "table", Where: []string{Call, Event}, Wire: []string{InCmd}, Doc: "request headers", DocType: "table `{ name = value }`", DocBounds: "at most 32768; packed, within `max_frame_size`"},
	{Name: "hash_key", Type: "string", Where: []string{Call, Event}, Wire: []string{InCmd}, Doc: `the key of balance = "hash"`, DocType: "string (a number is converted, with the digits that read back as the same number)", DocBounds: "at most 65536 bytes; required with `balance = \"hash\"`"},
	{Name: "request", Type: "string", Where: []string{Call, Event, Method}, Wire: []string{InCmd}, Doc: "request message type"},
	{Name: "response", Type: "string", Where: []string{Call, Method}, Wire: []string{InCmd}, Doc: "response message type (unary only)"},
	{Name: "json", Type: "boolean", Default: "false", Where: []string{Call, Event, Method}, Wire: []string{InCmd}, Doc: "JSON text both ways, or on one side; events take `true`, `false` or `\"request\"`", DocType: "boolean, `\"request\"` or `\"response\"`"},
	{Name: "discard_unknown", Type: "boolean", Default: "false", Where: []string{Call, Event, Method}, Wire: []string{InCmd}, Doc: "ignore unknown JSON fields"},
	{Name: "proto_names", Type: "boolean", Where: []string{Call, Method}, Wire: []string{InCmd}, Doc: ".proto field names in answers (unary only)", DocDefault: "`true` for tables, `false` for JSON"},
	{Name: "emit_unpopulated", Type: "boolean", Default: "false", Where: []string{Call, Method}, Wire: []string{InCmd}, Doc: "answers show fields that hold their zero value (0, \"\", false, [], {}) instead of leaving them out (unary only)"},
	{Name: "host", Type: "string", Where: []string{Configure}, Doc: "which host carries calls", DocDefault: "`\"resty_ffi\"` when `ngx.load_ffi` works, else `\"builtin\"`", DocBounds: "`\"builtin\"`, `\"resty_ffi\"`"},
	{Name: "lib", Type: "string", Where: []string{Configure}, Doc: "path of libffi_qrpc.so", DocType: "string (absolute path)", DocDefault: "searched"},
	{Name: "socket_dir", Type: "string", Default: `"/tmp"`, Where: []string{Configure}, Doc: "where wake-up sockets are made", DocType: "string (directory)", DocBounds: "the unix socket path must fit (108 bytes)"},
	{Name: "metrics_dict", Type: "string", Where: []string{Configure}, Doc: "lua_shared_dict for metrics", DocType: "string (`lua_shared_dict` name)", DocBounds: "an existing dict"},
	{Name: "pools_dict", Type: "string", Where: []string{Configure}, Doc: "the `shared` option of every connect that gives none (connects made after)", DocType: "string (`lua_shared_dict` name)", DocBounds: "an existing dict"},
	{Name: "max_connections", Type: "integer", Default: "256", Min: f(1), Max: f(65536), Where: []string{Configure}, Doc: "QUIC connections a worker may hold"},
	{Name: "gomaxprocs", Type: "integer", Min: f(1), Max: f(limits.GOMAXPROCS), Where: []string{Configure}, Doc: "the worker's Go Ps", DocDefault: "1 (built-in host), `min(2, Go's)` (lua-resty-ffi), or `$GOMAXPROCS`"},
	{Name: "metrics", Type: "boolean", Default: "true", Where: []string{Configure}, Doc: "record metrics for new connections"},
}

// LuaPath is where the Lua copy lives, from the repository's root.
const LuaPath = "lua/resty/ffi/qrpc/schema.lua"

func num(p *float64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatFloat(*p, 'f', -1, 64)
}

// LuaSource is schema.lua as make schema writes it.
func LuaSource() []byte {
	var b strings.Builder
	b.WriteString(`-- resty.ffi.qrpc.schema: every option of the API, as data. Generated
-- from internal/schema by "make schema": do not edit (make lint fails
-- when the two differ). Fields: name, type, default (Lua source text),
-- unit, min, min_open (min itself refused), max, where (a set of connect,
-- call, event, method, configure), key (picks the cached connection),
-- needs (another option this one goes with), doc.
-- luacheck: no max line length

return {
`)
	for _, o := range Options {
		where := make([]string, len(o.Where))
		for i, w := range o.Where {
			where[i] = w + " = true"
		}
		fmt.Fprintf(&b, "    { name = %q, type = %q, default = %q, unit = %q,\n", o.Name, o.Type, o.Default, o.Unit)
		fmt.Fprintf(&b, "      min = %s, min_open = %t, max = %s,\n", num(o.Min), o.MinOpen, num(o.Max))
		fmt.Fprintf(&b, "      where = { %s }, key = %t, needs = %q,\n", strings.Join(where, ", "), o.Key, o.Needs)
		fmt.Fprintf(&b, "      doc = %q },\n", o.Doc)
	}
	b.WriteString("}\n")
	return []byte(b.String())
}

// DocBegin and DocEnd mark the generated tables in docs/api.md.
const (
	DocPath  = "docs/api.md"
	DocBegin = "<!-- options: generated from internal/schema by make schema; do not edit -->\n"
	DocEnd   = "<!-- end of generated options -->\n"
)

func bounds(o Option) string {
	var parts []string
	if o.Unit != "" {
		parts = append(parts, o.Unit)
	}
	switch {
	case o.Min != nil && o.Max != nil && !o.MinOpen:
		parts = append(parts, num(o.Min)+".."+num(o.Max))
	case o.Min != nil && o.Max != nil:
		parts = append(parts, "> "+num(o.Min)+", at most "+num(o.Max))
	}
	if o.DocBounds != "" {
		parts = append(parts, o.DocBounds)
	}
	return strings.Join(parts, ", ")
}

func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// DocTables is the markdown docs/api.md carries between DocBegin and
// DocEnd: one table per entry point.
func DocTables() string {
	var b strings.Builder
	b.WriteString(DocBegin)
	for _, t := range []struct{ where, title string }{
		{Configure, "**`qrpc.configure`** (details in [qrpc.configure](#qrpcconfigure)):"},
		{Connect, "**`qrpc.connect`**, one server or a pool (details in [qrpc.connect](#qrpcconnect) and [pools.md](pools.md)); key: part of what picks the cached connection:"},
		{Call, "**`conn:unary` and `conn:event`** (details in [conn:unary](#connunary), [conn:event](#connevent), [pools.md](pools.md) and [protobuf.md](protobuf.md#calls)); `event` takes those marked event:"},
	} {
		fmt.Fprintf(&b, "\n%s\n\n| option | type | default | unit, bounds | meaning |\n| --- | --- | --- | --- | --- |\n", t.title)
		for _, o := range Options {
			in := false
			for _, w := range o.Where {
				in = in || w == t.where
			}
			if !in {
				continue
			}
			typ := o.Type
			if o.DocType != "" {
				typ = o.DocType
			}
			d := "none"
			if o.Default != "" {
				d = "`" + o.Default + "`"
			}
			if o.DocDefault != "" {
				d = o.DocDefault
			}
			doc := o.Doc
			switch t.where {
			case Connect:
				if o.Key {
					doc += " (key)"
				}
			case Call:
				for _, w := range o.Where {
					if w == Event {
						doc += " (event)"
					}
				}
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", o.Name, cell(typ), cell(d), cell(bounds(o)), cell(doc))
		}
	}
	b.WriteString("\n" + DocEnd)
	return b.String()
}

// SpliceDoc replaces the generated part of doc (between the markers).
func SpliceDoc(doc string) (string, error) {
	i := strings.Index(doc, DocBegin)
	j := strings.Index(doc, DocEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("%s: no generated options (markers %q ... %q)", DocPath, strings.TrimSpace(DocBegin), strings.TrimSpace(DocEnd))
	}
	return doc[:i] + DocTables() + doc[j+len(DocEnd):], nil
}
