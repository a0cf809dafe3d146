package nginx

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// limitsProto: a message nested in itself every way a request can (a
// field, a list's item, a map's value, a oneof's member), that can hold a
// FieldMask (which sends the slow path through the mask lifter), with the
// 64-bit integers and the JSON-valued well-known types.
const limitsProto = `syntax = "proto3";
package lim;
import "google/protobuf/field_mask.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/wrappers.proto";
message Node {
  Node next = 1;
  repeated Node items = 2;
  map<string, Node> by_name = 3;
  oneof pick { Node one = 4; string other = 5; }
  google.protobuf.FieldMask mask = 6;
  google.protobuf.Struct st = 7;
  google.protobuf.Value va = 8;
  google.protobuf.ListValue lv = 9;
  int64 i64 = 10;
  uint64 u64 = 11;
  fixed64 f64 = 12;
  sfixed64 sf64 = 13;
  sint64 s64 = 14;
  google.protobuf.Int64Value w64 = 15;
  google.protobuf.UInt64Value wu64 = 16;
  repeated int64 ri64 = 17;
  int32 n = 18;
}
`

// startLimits: an nginx of one worker with lim.Node loaded, an echo
// server, /json (a JSON body, json = true) and /tbl (a Lua chunk that
// returns the request table; the answer as JSON).
func startLimits(t *testing.T) *nginxProc {
	t.Helper()
	dir, err := os.MkdirTemp("", "qlim-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "lim.proto"), []byte(limitsProto), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	srv.Handle("Echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		resp.Body = append([]byte(nil), req.Body...)
	})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	init := lines(
		`        local qrpc = require "resty.ffi.qrpc"`,
		`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
		`        assert(qrpc.proto.load("lim.proto", { import_paths = { "`+dir+`" } }))`,
	)
	server := `
        client_max_body_size 4m;
        client_body_buffer_size 4m;
` + loc("/json", `
                local qt = require "qtest"
                local conn = assert(require("resty.ffi.qrpc").connect(qt.lim_addr, qt.opts({ timeout = 5000 })))
                ngx.req.read_body()
                local res, err = conn:unary("Echo", ngx.req.get_body_data() or "",
                    { request = "lim.Node", response = "lim.Node", json = true })
                if not res then ngx.status = 400 return ngx.print(err) end
                ngx.print(res.body)
`) + loc("/tbl", `
                local qt = require "qtest"
                local conn = assert(require("resty.ffi.qrpc").connect(qt.lim_addr, qt.opts({ timeout = 5000 })))
                ngx.req.read_body()
                local tbl = assert(loadstring(ngx.req.get_body_data()))()
                local res, err = conn:unary("Echo", tbl,
                    { request = "lim.Node", response = "lim.Node", json = "response" })
                if not res then ngx.status = 400 return ngx.print(err) end
                ngx.print(res.body)
`)
	return startNginx(t, ngxConf{
		Workers:   1,
		InitByLua: init,
		Extra:     map[string]string{"lim_addr": a.String()},
		Server:    server,
	})
}

// peakRSS is the worker's VmHWM in kB.
func peakRSS(t *testing.T, n *nginxProc) int {
	t.Helper()
	pids := n.workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("workers %v", pids)
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "VmHWM:" {
			kb, _ := strconv.Atoi(f[1])
			return kb
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestJSONRequestNesting: a JSON request nesting messages 8000 deep (72
// KB) cost the worker memory and time quadratic in the depth (from 1.9 to
// 3.1 GB and over 4 s, other calls of the worker waiting), through the
// FieldMask lifter of the slow path. It is refused now past 100 levels,
// as a table body is, at once; 100 levels pass.
func TestJSONRequestNesting(t *testing.T) {
	t.Parallel()
	n := startLimits(t)
	n.req(t, "POST", "/json", `{"n":1}`) // warm: the library and the schema
	deep := func(open, close string, k int) string {
		return strings.Repeat(open, k) + `{"n":1}` + strings.Repeat(close, k)
	}
	for _, c := range []struct {
		name, body string
		ok         bool
	}{
		{"field, 100 levels", deep(`{"next":`, `}`, 99), true},
		{"list, 100 levels", `{"items":[{"next":` + deep(`{"items":[`, `]}`, 48) + `}]}`, true},
		{"field, 101 levels", deep(`{"next":`, `}`, 100), false},
		{"field, 8000 levels", deep(`{"next":`, `}`, 7999), false},
		{"map, 8000 levels", deep(`{"byName":{"k":`, `}}`, 4000), false},
		{"oneof, 8000 levels", deep(`{"one":`, `}`, 7999), false},
	} {
		before := peakRSS(t, n)
		start := time.Now()
		r := n.req(t, "POST", "/json", c.body)
		took := time.Since(start)
		grew := peakRSS(t, n) - before
		switch {
		case c.ok && r.status != 200:
			t.Errorf("%s: %d %.200s", c.name, r.status, r.body)
		case !c.ok && (r.status != 400 || r.body != "bad message: lim.Node: nested too deep (more than 100 levels)"):
			t.Errorf("%s: %d %.200s, want the nesting refused", c.name, r.status, r.body)
		}
		t.Logf("%s (%d bytes): %d, peak RSS +%d kB, %v", c.name, len(c.body), r.status, grew, took)
		if grew > 32<<10 || took > 2*time.Second {
			t.Errorf("%s (%d bytes): worker's peak RSS grew by %d MB, %v", c.name, len(c.body), grew>>10, took)
		}
	}
}

// tblCase: a Lua chunk returning a request table, and the answer's JSON
// (protojson's form of the echo), or "!" and the error.
type tblCase struct{ lua, want string }

func runTbl(t *testing.T, n *nginxProc, cases []tblCase) {
	t.Helper()
	for _, c := range cases {
		r := n.req(t, "POST", "/tbl", c.lua, "Content-Type", "text/plain")
		if strings.HasPrefix(c.want, "!") {
			if r.status != 400 || r.body != c.want[1:] {
				t.Errorf("%s: %d %s; want 400 %s", c.lua, r.status, r.body, c.want[1:])
			}
		} else if r.status != 200 || r.body != c.want {
			t.Errorf("%s: %d %s; want 200 %s", c.lua, r.status, r.body, c.want)
		}
	}
}

// TestTableBigIntegers: a Lua number beyond 2^53 for a 64-bit integer
// field is sent as the integer the double holds (2^60 went as
// 1152921504606847000); one out of the field's range is refused (2^63
// for an int64 went as 9223372036854775800).
func TestTableBigIntegers(t *testing.T) {
	t.Parallel()
	n := startLimits(t)
	runTbl(t, n, []tblCase{
		{`return { i64 = 2^60 }`, `{"i64":"1152921504606846976"}`},
		{`return { i64 = -2^63 }`, `{"i64":"-9223372036854775808"}`},
		{`return { i64 = 1e18 }`, `{"i64":"1000000000000000000"}`},
		{`return { u64 = 2^63, f64 = 2^64 - 2^11 }`, `{"u64":"9223372036854775808","f64":"18446744073709549568"}`},
		{`return { sf64 = -2^62, s64 = 2^62 + 2^12 }`, `{"sf64":"-4611686018427387904","s64":"4611686018427392000"}`},
		{`return { ri64 = { 2^60, 1 }, w64 = 2^60, wu64 = 2^63 }`, `{"w64":"1152921504606846976","wu64":"9223372036854775808","ri64":["1152921504606846976","1"]}`},
		{`return { i64 = 2^60, st = { a = 2^60 } }`, `{"st":{"a":1152921504606847000},"i64":"1152921504606846976"}`},
		{`return { i64 = 2^63 }`, `!bad message: lim.Node: i64: out of range for int64: 9223372036854775808`},
		{`return { u64 = 2^64 }`, `!bad message: lim.Node: u64: out of range for uint64: 1.8446744073709552e+19`},
		{`return { f64 = -1 }`, `!bad message: lim.Node: f64: out of range for fixed64: -1`},
		{`return { wu64 = -2^60 }`, `!bad message: lim.Node: wu64: out of range for uint64: -1152921504606846976`},
	})
}

// TestTableNonFiniteInValues: NaN, ±inf and 64-bit integer cdata in a
// request table's Struct, Value or ListValue went out as the strings
// "NaN", "Infinity", "9007199254740993". They are refused now (proto3
// JSON has no such numbers), and a cdata a double holds is the number;
// in a double field, a wrapper or an int64 field they are what they were.
func TestTableNonFiniteInValues(t *testing.T) {
	t.Parallel()
	n := startLimits(t)
	runTbl(t, n, []tblCase{
		{`return { st = { n = 0/0 } }`, `!bad message: lim.Node: st.n: expected a finite number (google.protobuf.Value), got NaN`},
		{`return { va = 0/0 }`, `!bad message: lim.Node: va: expected a finite number (google.protobuf.Value), got NaN`},
		{`return { st = { n = math.huge } }`, `!bad message: lim.Node: st.n: expected a finite number (google.protobuf.Value), got Infinity`},
		{`return { lv = { 1, -math.huge } }`, `!bad message: lim.Node: lv[1]: expected a finite number (google.protobuf.Value), got -Infinity`},
		{`return { next = { st = { l = { { x = 0/0 } } } } }`, `!bad message: lim.Node: next.st.l[0].x: expected a finite number (google.protobuf.Value), got NaN`},
		{`return { st = { n = 9007199254740993LL } }`, `!bad message: lim.Node: st.n: not exact as a double (google.protobuf.Value): 9007199254740993`},
		{`return { st = { n = 9007199254740992LL, m = -5LL, s = "NaN" } }`, `{"st":{"m":-5,"n":9007199254740992,"s":"NaN"}}`},
		{`return { va = 2ULL^60 }`, `{"va":1152921504606847000}`},
		{`return { i64 = 9007199254740993LL, w64 = 9007199254740993LL, st = { a = 1 } }`, `{"st":{"a":1},"i64":"9007199254740993","w64":"9007199254740993"}`},
	})
}
