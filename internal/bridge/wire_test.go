package bridge

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/schema"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// recs builds a record block from "name=value" lines, as the tests read
// best: name is a schema WireKeys name in lower case, value is written as
// the key's type says (a value that does not parse as that type goes in
// as its bytes, which the decoder must refuse). Lists are "a,b,c" for the
// repeatable THROTTLE_CODE and the bit set HEALTH_ON (connect, reset,
// timeout); "hedge_delay_ms=p95" is HEDGE_P95.
func recs(text string) []byte {
	var b []byte
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		name, val, _ := strings.Cut(line, "=")
		switch name {
		case "health_on":
			var n int64
			for _, w := range strings.Split(val, ",") {
				n |= map[string]int64{"connect": 1, "reset": 2, "timeout": 4}[w]
			}
			b = AppendInt(b, KeyHealthOn, n)
			continue
		case "throttle_codes":
			for _, w := range strings.Split(val, ",") {
				n, _ := strconv.ParseInt(w, 10, 64)
				b = AppendInt(b, KeyThrottleCode, n)
			}
			continue
		case "hedge_delay_ms":
			if val == "p95" {
				b = AppendInt(b, KeyHedgeP95, 1)
				continue
			}
		case "kind":
			name = "profile_kind"
		case "seconds":
			name = "profile_seconds"
		}
		var k *schema.WireKey
		for i := range schema.WireKeys {
			if schema.WireKeys[i].Name == strings.ToUpper(name) {
				k = &schema.WireKeys[i]
			}
		}
		if k == nil {
			// an unknown key: one the schema will never number
			b = AppendStr(b, 0xffff, val)
			continue
		}
		switch k.Type {
		case schema.Int:
			if n, err := strconv.ParseInt(val, 10, 64); err == nil {
				b = AppendInt(b, k.ID, n)
				continue
			}
		case schema.Float:
			if f, err := strconv.ParseFloat(val, 64); err == nil {
				b = AppendFloat(b, k.ID, f)
				continue
			}
		}
		b = AppendStr(b, k.ID, val)
	}
	return b
}

// recText renders a record block as recs reads it ("name=value\n" in
// the block's order, names in lower case); a malformed block is "!" and
// the error.
func recText(b []byte) string {
	var out strings.Builder
	err := eachRec(b, func(r Rec) error {
		name := "?"
		for _, k := range schema.WireKeys {
			if k.ID == r.Key {
				name = strings.ToLower(k.Name)
			}
		}
		switch wireTypes[r.Key] {
		case recInt:
			fmt.Fprintf(&out, "%s=%d\n", name, r.Int())
		case recFloat:
			fmt.Fprintf(&out, "%s=%g\n", name, r.Float())
		default:
			fmt.Fprintf(&out, "%s=%s\n", name, r.Val)
		}
		return nil
	})
	if err != nil {
		return "!" + err.Error()
	}
	return out.String()
}

// Every key of the schema has its type in wireTypes, and the decoder
// returns what the encoder wrote, for each type.
func TestRecordsRoundTrip(t *testing.T) {
	for _, k := range schema.WireKeys {
		want := map[string]uint8{schema.Str: recStr, schema.Int: recInt, schema.Float: recFloat}[k.Type]
		if int(k.ID) >= len(wireTypes) || wireTypes[k.ID] != want {
			t.Fatalf("key %s (%d): wireTypes is stale: run make schema", k.Name, k.ID)
		}
	}
	b := AppendStr(nil, KeyAddr, "a:1")
	b = AppendInt(b, KeyRetries, -3)
	b = AppendFloat(b, KeyBudgetRatio, 0.25)
	b = AppendStr(b, KeyAddr, "")
	var got []string
	err := eachRec(b, func(r Rec) error {
		switch wireTypes[r.Key] {
		case recInt:
			got = append(got, strconv.FormatInt(r.Int(), 10))
		case recFloat:
			got = append(got, strconv.FormatFloat(r.Float(), 'g', -1, 64))
		default:
			got = append(got, r.Str())
		}
		return nil
	})
	if err != nil || strings.Join(got, "|") != "a:1|-3|0.25|" {
		t.Fatalf("got %q, %v", got, err)
	}
	if n := binary.NativeEndian.Uint16(b); n != KeyAddr {
		t.Fatalf("first key %d", n)
	}
}

// Malformed blocks are refused with a message that says why.
func TestRecordsMalformed(t *testing.T) {
	whole := AppendInt(nil, KeyRetries, 1)
	for _, tc := range []struct {
		b    []byte
		want string
	}{
		{whole[:5], "cut short"},
		{whole[:13], "8 bytes, 7 left"},
		{AppendStr(nil, 999, "x"), "unknown record key 999"},
		{AppendStr(nil, 0, "x"), "unknown record key 0"},
		{AppendStr(nil, KeyRetries, "1234"), "a number of 4 bytes"},
		{make([]byte, maxOptsLen+1), "at most"},
	} {
		err := eachRec(tc.b, func(Rec) error { return nil })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("% x: %v, want %q", tc.b[:min(len(tc.b), 16)], err, tc.want)
		}
	}
}

// Decoding a block allocates nothing: it runs for every call that
// carries per-call pool options.
func TestRecordsNoAlloc(t *testing.T) {
	b := AppendInt(AppendInt(nil, KeyTryTimeoutMs, 300), KeyHedgeMax, 1)
	var sum int64
	n := testing.AllocsPerRun(100, func() {
		_ = eachRec(b, func(r Rec) error { sum += r.Int(); return nil })
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// FuzzRecords: any bytes, as CONNECT, call, CONFIGURE and PEERS-answer
// blocks: no panic, and a block the decoder accepts re-encodes to itself.
func FuzzRecords(f *testing.F) {
	f.Add(recs("addr=a:1\naddr=b:2\nbalance=hash\nhealth_on=connect,timeout\nbudget_ratio=0.5\nthrottle_k=2\nthrottle_codes=8,14\n"))
	f.Add(recs("try_timeout_ms=300\nhedge_delay_ms=p95\nhedge_max=2\n"))
	f.Add(AppendInt(nil, KeyGomaxprocs, 2))
	f.Add([]byte{1, 0, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		var again []byte
		err := eachRec(b, func(r Rec) error {
			switch wireTypes[r.Key] {
			case recInt:
				again = AppendInt(again, r.Key, r.Int())
			case recFloat:
				f := r.Float()
				if math.IsNaN(f) {
					again = append(appendHead(again, r.Key, 8), r.Val...)
				} else {
					again = AppendFloat(again, r.Key, f)
				}
			default:
				again = AppendStr(again, r.Key, r.Str())
			}
			return nil
		})
		if err == nil && !bytes.Equal(again, b) {
			t.Fatalf("% x re-encodes as % x", b, again)
		}
		var pc Command
		pc.Op, pc.Addr, pc.Opts = OpConnect, []byte("a:1"), b
		_, _, _ = poolConfig(&pc, &qrpc.Config{})
		var call qrpc.Call
		_ = callOpts(b, &call)
	})
}
