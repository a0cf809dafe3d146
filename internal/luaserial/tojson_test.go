package luaserial

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

// checkRoundTrip: the JSON text ToJSON writes for FromJSON's bytes of js
// reads, with encoding/json, as js does (an empty array as an empty
// object: both are the empty table).
func checkRoundTrip(t testing.TB, js []byte) {
	t.Helper()
	var want any
	if json.Unmarshal(js, &want) != nil || !utf8Valid(js) {
		return // not JSON for encoding/json, or invalid UTF-8, which it replaces
	}
	ser, err := FromJSON(nil, js)
	if err != nil {
		return // deeper than a table holds, or a duplicate key
	}
	out, err := ToJSON([]byte("keep"), ser)
	if err != nil || !bytes.HasPrefix(out, []byte("keep")) {
		t.Fatalf("%.80q: ToJSON: %q %v", js, out, err)
	}
	var got any
	if err := json.Unmarshal(out[4:], &got); err != nil {
		t.Fatalf("%.80q: ToJSON wrote invalid JSON %.80q: %v", js, out[4:], err)
	}
	if !reflect.DeepEqual(emptyAsObject(got), emptyAsObject(want)) {
		t.Fatalf("%.80q: ToJSON wrote %.80q", js, out[4:])
	}
}

func emptyAsObject(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = emptyAsObject(e)
		}
	case []any:
		if len(x) == 0 {
			return map[string]any{}
		}
		for i, e := range x {
			x[i] = emptyAsObject(e)
		}
	}
	return v
}

var roundTripSeeds = []string{
	`{"id":"1234567890123","name":"Ada Lovelace","age":36,"active":true,"score":98.25,"tags":["a","b"],"o":{}}`,
	`{"a":{"b":{"c":[1,[2,[]],null,{}]}},"n":-1.5e-7,"big":1.7976931348623157e308,"tiny":5e-324}`,
	`[0.1,0.30000000000000004,4294967295,-2147483648,123456789012345678,1e15,-0,123456789012345.6]`,
	`{"esc":"q\"\\\/\b\f\n\r\t\u0001\u007f","é":"ü","":"","1":"a","-2":[true,false]}`,
	`"x"`, `12`, `null`, `[]`, `{}`,
}

func TestToJSONRoundTrip(t *testing.T) {
	for _, js := range roundTripSeeds {
		checkRoundTrip(t, []byte(js))
	}
}

// FuzzToJSONRoundTrip: JSON → FromJSON → ToJSON reads as encoding/json
// reads the input, for any input.
func FuzzToJSONRoundTrip(f *testing.F) {
	for _, js := range roundTripSeeds {
		f.Add([]byte(js))
	}
	f.Fuzz(func(t *testing.T, js []byte) { checkRoundTrip(t, js) })
}

func TestToJSONHandWritten(t *testing.T) {
	for _, tc := range []struct {
		name string
		ser  string
		want string // "!" + error text for a ValueError, "?" for malformed
	}{
		{"null value", "\x09\x01\x21a\x03", `{"a":null}`},
		{"null in a list", "\x0c\x03\x03\x02", `[null,true]`},
		{"int tag", "\x0c\x02\x06\xfe\xff\xff\xff", `[-2]`},
		{"int key", "\x09\x01\x06\x07\x00\x00\x00\x02", `{"7":true}`},
		{"light userdata", "\x09\x01\x21a\x05\x01\x02\x03\x04\x05\x06\x07\x08", "!cannot encode a userdata value"},
		{"light userdata 32", "\x0c\x02\x04\x01\x02\x03\x04", "!cannot encode a userdata value"},
		{"null key", "\x09\x01\x03\x02", "!table keys must be strings or integers (got userdata)"},
		{"boolean key", "\x09\x01\x01\x02", "!table keys must be strings or integers (got boolean)"},
		// 64-bit integer cdata keys (a map<int64, ...>'s), every digit:
		// { [9007199254740993LL] = true } as LuaJIT writes it
		{"int64 key", "\x09\x01\x10\x01\x00\x00\x00\x00\x00\x20\x00\x02", `{"9007199254740993":true}`},
		{"int64 key, the least", "\x09\x01\x10\x00\x00\x00\x00\x00\x00\x00\x80\x02", `{"-9223372036854775808":true}`},
		{"uint64 key", "\x09\x01\x11\xff\xff\xff\xff\xff\xff\xff\xff\x02", `{"18446744073709551615":true}`},
		{"int64 key 1 is no list", "\x09\x01\x10\x01\x00\x00\x00\x00\x00\x00\x00\x02", `{"1":true}`},
		{"int64 keys of one value", "\x09\x02\x10\x01\x00\x00\x00\x00\x00\x00\x00\x02\x10\x01\x00\x00\x00\x00\x00\x00\x00\x01", `{"1":false,"1":true}`},
		{"complex key", "\x09\x01\x12" + strings.Repeat("\x00", 16) + "\x02", "!table keys must be strings or integers (got cdata)"},
		{"truncated int64 key", "\x09\x01\x10\x01\x00\x00", "?"},
		{"array of errors stops at the first", "\x0c\x03\x12" + strings.Repeat("\x00", 16) + "\x05" + strings.Repeat("\x00", 8), "!cannot encode a cdata value"},
		{"empty", "", "?"},
		{"not a table tag", "\x13", "?"},
		{"string dict", "\x0f\x00", "?"},
		{"truncated count", "\x09\xff\x01", "?"},
		{"count past the end", "\x09\x05\x21a\x02", "?"},
		{"truncated number", "\x0c\x02\x07\x00\x00", "?"},
		{"string past the end", "\x0c\x02\x25ab", "?"},
		{"trailing bytes", "\x08\x00", "?"},
		{"tab_mt of a string", "\x0e\x00\x21a", "?"},
		{"1-based array of size 0", "\x0c\x00", "?"},
		{"duplicate index", "\x0d\x02\x01\x02\x07\x00\x00\x00\x00\x00\x00\xf0\x3f\x02", "?"},
		{"NaN key", "\x09\x01\x07\x00\x00\x00\x00\x00\x00\xf8\x7f\x02", "?"},
		{"nil as a value", "\x09\x01\x21a\x00", "?"},
	} {
		got, err := ToJSON(nil, []byte(tc.ser))
		var ve *ValueError
		var me *MalformedError
		switch {
		case tc.want == "?":
			if !errors.As(err, &me) {
				t.Errorf("%s: got %q, %v; want a MalformedError", tc.name, got, err)
			}
		case strings.HasPrefix(tc.want, "!"):
			if !errors.As(err, &ve) || ve.What != tc.want[1:] {
				t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want[1:])
			}
		default:
			if err != nil || string(got) != tc.want {
				t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
			}
		}
	}
}

// Depth: LuaJIT's encoder writes 100 nested tables at most; so many are
// read, one more is malformed.
func TestToJSONDepth(t *testing.T) {
	nest := func(n int) []byte {
		var b []byte
		for i := 1; i < n; i++ {
			b = append(b, 0x09, 0x01, 0x21, 'x')
		}
		return append(b, 0x08)
	}
	out, err := ToJSON(nil, nest(MaxDepth))
	if err != nil || strings.Count(string(out), "{") != MaxDepth {
		t.Fatalf("%d levels: %v", MaxDepth, err)
	}
	var me *MalformedError
	if _, err := ToJSON(nil, nest(MaxDepth+1)); !errors.As(err, &me) {
		t.Fatalf("%d levels: %v, want malformed", MaxDepth+1, err)
	}
}

// appendNumber against C's printf (%.15g, else %.17g; values from Python's
// % operator, which calls it), and integers of magnitude below 2^64 in
// exact digits.
func TestAppendNumber(t *testing.T) {
	for _, tc := range []struct {
		f    float64
		want string
	}{
		{0.1, "0.1"}, {0.30000000000000004, "0.30000000000000004"}, {1e300, "1e+300"}, {-1e300, "-1e+300"},
		{1e-300, "1e-300"}, {5e-324, "4.94065645841247e-324"}, {1.5, "1.5"}, {-2.5, "-2.5"},
		{1e15, "1000000000000000"}, {-1e15, "-1000000000000000"}, {1e16, "10000000000000000"}, {123456789012345.6, "123456789012345.59"},
		{1.2345678901234568e-05, "1.2345678901234568e-05"}, {0.0001, "0.0001"}, {1e-05, "1e-05"},
		{9223372036854775808, "9223372036854775808"}, {-9223372036854775808, "-9223372036854775808"},
		{1 << 60, "1152921504606846976"}, {18446744073709549568, "18446744073709549568"},
		{18446744073709551616, "1.8446744073709552e+19"}, {-18446744073709551616, "-1.8446744073709552e+19"},
		{1.0 / 3, "0.33333333333333331"}, {2.0 / 3, "0.66666666666666663"}, {1e21, "1e+21"}, {1e-07, "1e-07"},
		{9007199254740992.0, "9007199254740992"}, {1234567.125, "1234567.125"}, {1e100 / 3, "3.3333333333333332e+99"},
		{1.7920435971799646e-16, "1.7920435971799646e-16"}, {5.972115650501124e-187, "5.9721156505011241e-187"},
		{9.051962159641863e-294, "9.051962159641863e-294"}, {3.47746221006508e-282, "3.47746221006508e-282"},
		{9.318011888364065e-180, "9.3180118883640652e-180"}, {8.547742197736996e-139, "8.5477421977369962e-139"},
		{0, "0"}, {math.Copysign(0, -1), "-0"}, {99999999999999, "99999999999999"}, {-999999999999999, "-999999999999999"},
		{math.NaN(), `"NaN"`}, {math.Inf(1), `"Infinity"`}, {math.Inf(-1), `"-Infinity"`},
	} {
		if got := string(appendNumber(nil, tc.f)); got != tc.want {
			t.Errorf("%v: got %s, want %s", tc.f, got, tc.want)
		}
	}
}

// Whatever the bytes, ToJSON returns: valid JSON, or an error; and it
// leaves dst's bytes alone.
func FuzzToJSON(f *testing.F) {
	// tables serialized by a real LuaJIT (internal/transcode's seeds)
	if b, err := os.ReadFile("../transcode/testdata/lua_seeds.txt"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			_, h, _ := strings.Cut(line, " ")
			if ser, err := hex.DecodeString(h); err == nil && len(ser) < 4096 {
				f.Add(ser)
			}
		}
	}
	f.Add([]byte("\x0e\x00\x08"))
	f.Add([]byte("\x0d\x02\x01\x02\x21a\x03"))
	f.Fuzz(func(t *testing.T, ser []byte) {
		dst := []byte("prefix")
		out, err := ToJSON(dst, ser)
		if string(out[:6]) != "prefix" {
			t.Fatalf("dst changed: %q", out)
		}
		if err != nil {
			return
		}
		if !json.Valid(out[6:]) {
			t.Fatalf("invalid JSON %q from %x", out[6:], ser)
		}
		// the marks are strings of the same text
		marked, marks, err := ToJSONMarked([]byte("prefix"), ser, nil)
		if err != nil || !bytes.Equal(marked, out) {
			t.Fatalf("marked: %q, %v; unmarked %q", marked, err, out)
		}
		last := 6
		for _, mk := range marks {
			if mk.At < last || mk.End-mk.At < 3 || out[mk.At] != '"' || out[mk.End-1] != '"' {
				t.Fatalf("mark %+v in %q", mk, out)
			}
			last = mk.End
		}
	})
}

// demo.Profile as the Lua module sends it (bench/proto.go's message,
// serialized by string.buffer).
const profileSer = "090a276372656174656434323032342d30352d30365430373a30383a30395a24746167730c04246d61746827656e67696e657326706f657472792573636f726507000000000090584026616374697665022361676507000000000000424025656d61696c2f616461406578616d706c652e636f6d246e616d652c416461204c6f76656c6163652269642d3132333435363738393031323326617661746172406956424f5277304b47676f774d54497a4e4455324e7a673559574a6a5a47566d25636f6c6f722b434f4c4f525f475245454e"

func BenchmarkToJSONProfile(b *testing.B) {
	ser, err := hex.DecodeString(profileSer)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if buf, err = ToJSON(buf[:0], ser); err != nil {
			b.Fatal(err)
		}
	}
}
