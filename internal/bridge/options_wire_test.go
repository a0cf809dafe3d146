package bridge

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/schema"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// recordMeaning is what one record key sets when Go reads it: the field
// (a path into qrpc.PoolConfig for CONNECT, qrpc.Call for UNARY) and its
// value after reading val (string, int64 or float64), read after the
// records of with.
type recordMeaning struct {
	field string
	val   any
	want  any
	with  map[string]any
}

var recordMeanings = map[string]recordMeaning{
	"BALANCE":           {field: "Balance", val: "p2c", want: qrpc.P2C},
	"HEALTH_FAILURES":   {field: "Failures", val: int64(5), want: 5},
	"HEALTH_EJECT_MS":   {field: "Eject", val: int64(5), want: 5 * time.Millisecond},
	"HEALTH_STALL_MS":   {field: "Stall", val: int64(5), want: 5 * time.Millisecond},
	"HEALTH_ON":         {field: "EjectOn", val: int64(2), want: qrpc.FailReset},
	"CHECK_METHOD":      {field: "Check.Method", val: "ping", want: "ping"},
	"CHECK_INTERVAL_MS": {field: "Check.Interval", val: int64(5), want: 5 * time.Millisecond},
	"CHECK_TIMEOUT_MS":  {field: "Check.Timeout", val: int64(5), want: 5 * time.Millisecond},
	"RETRIES":           {field: "Retries", val: int64(2), want: 2},
	"TRY_TIMEOUT_MS":    {field: "TryTimeout", val: int64(5), want: 5 * time.Millisecond},
	"HEDGE_DELAY_MS":    {field: "Hedge.Delay", val: int64(5), want: 5 * time.Millisecond},
	"HEDGE_P95":         {field: "Hedge.P95", val: int64(1), want: true},
	"HEDGE_MAX":         {field: "Hedge.Max", val: int64(2), want: 2},
	"BUDGET_RATIO":      {field: "RetryRatio", val: 0.5, want: 0.5},
	"BUDGET_MIN_PER_S":  {field: "RetryMinPerS", val: int64(5), want: 5},
	"RESOLVE_MS":        {field: "Resolve", val: int64(5), want: 5 * time.Millisecond},
	"RESOLVER":          {field: "Resolver", val: "127.0.0.1:53", want: "127.0.0.1:53"},
	"STREAM_BATCH":      {field: "StreamBatch", val: int64(5), want: 5},
	"THROTTLE_K":        {field: "Throttle.K", val: 2.0, want: 2.0},
	"THROTTLE_CODE":     {field: "Throttle.Codes", val: int64(503), want: []uint32{503}, with: map[string]any{"THROTTLE_K": 2.0}},
}

func appendRec(t *testing.T, b []byte, name string, v any) []byte {
	t.Helper()
	k, ok := schema.WireKeyNamed(name)
	if !ok {
		t.Fatalf("no record key %s", name)
	}
	switch v := v.(type) {
	case string:
		return AppendStr(b, k.ID, v)
	case int64:
		return AppendInt(b, k.ID, v)
	case float64:
		return AppendFloat(b, k.ID, v)
	}
	t.Fatalf("%s: value %T", name, v)
	return nil
}

// TestOptionRecordsDecoded: each record key that internal/schema says
// carries an option of connect, a call or a methods entry is read by that
// command's decoder (poolConfig for CONNECT, callOpts for UNARY) into the
// field it means, and into nothing else. TestWireOfOptions (nginx) holds
// Lua's encoder to the same keys.
func TestOptionRecordsDecoded(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range schema.Options {
		for _, where := range o.Where {
			for _, k := range schema.RecordsAt(o, where) {
				op := schema.OptionOps[where]
				if seen[op+k.Name] {
					continue
				}
				seen[op+k.Name] = true
				m, ok := recordMeanings[k.Name]
				if !ok {
					t.Errorf("%s (option %s): no entry in recordMeanings: say what it sets", k.Name, o.Name)
					continue
				}
				var with []byte
				for name, v := range m.with {
					with = appendRec(t, with, name, v)
				}
				block := appendRec(t, append([]byte(nil), with...), k.Name, m.val)
				var before, after reflect.Value
				switch op {
				case "CONNECT":
					read := func(opts []byte) reflect.Value {
						_, pc, err := poolConfig(&Command{Addr: []byte("127.0.0.1:1"), Opts: opts}, &qrpc.Config{})
						if err != nil {
							t.Fatalf("CONNECT %s (option %s): %v", k.Name, o.Name, err)
						}
						return reflect.ValueOf(pc).Elem()
					}
					before, after = read(with), read(block)
				case "UNARY":
					read := func(opts []byte) reflect.Value {
						var c qrpc.Call
						if err := callOpts(opts, &c); err != nil {
							t.Fatalf("UNARY %s (option %s): %v", k.Name, o.Name, err)
						}
						return reflect.ValueOf(&c).Elem()
					}
					before, after = read(with), read(block)
				default:
					t.Fatalf("%s (option %s): records of %s are not read here", k.Name, o.Name, op)
				}
				path := strings.Split(m.field, ".")
				if got := after.FieldByName(path[0]); !got.IsValid() {
					t.Fatalf("%s: %s has no field %s", k.Name, after.Type(), path[0])
				}
				got := after
				for _, f := range path {
					got = got.FieldByName(f)
				}
				if !reflect.DeepEqual(got.Interface(), m.want) {
					t.Errorf("%s %s = %v (option %s): %s is %v, want %v", op, k.Name, m.val, o.Name, m.field, got.Interface(), m.want)
				}
				// nothing else changed: put the field back and compare
				changed := reflect.New(after.Type()).Elem()
				changed.Set(after)
				changed.FieldByName(path[0]).Set(before.FieldByName(path[0]))
				if !reflect.DeepEqual(changed.Interface(), before.Interface()) {
					t.Errorf("%s %s (option %s): sets more than %s:\n%+v\nwas\n%+v", op, k.Name, o.Name, path[0], after.Interface(), before.Interface())
				}
			}
		}
	}
}
