package luaserial

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

// null is JSON null as read back by readValue (LuaJIT: the NULL light
// userdata).
type null struct{}

// readValue is a reader of the format written from LuaJIT's
// specification (doc/ext_buffer.html, "Serialization Format
// Specification") for the tags FromJSON writes, stricter than LuaJIT
// where it can be (no trailing bytes, canonical lengths aside): tables
// become map[string]any (hash part) or []any (1-based array part).
func readValue(b []byte) (any, []byte, error) {
	if len(b) == 0 {
		return nil, nil, errors.New("end of data")
	}
	tag, b, err := readU124(b)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case tag >= tagStr:
		n := int(tag - tagStr)
		if n > len(b) {
			return nil, nil, fmt.Errorf("string of %d bytes in %d", n, len(b))
		}
		return string(b[:n]), b[n:], nil
	case tag == tagFalse:
		return false, b, nil
	case tag == tagTrue:
		return true, b, nil
	case tag == tagNull:
		return null{}, b, nil
	case tag == tagNum:
		if len(b) < 8 {
			return nil, nil, errors.New("short number")
		}
		return math.Float64frombits(binary.LittleEndian.Uint64(b)), b[8:], nil
	case tag == tagTab:
		return map[string]any{}, b, nil
	case tag == tagHash:
		n, b, err := readU124(b)
		if err != nil {
			return nil, nil, err
		}
		m := map[string]any{}
		for range n {
			var k, v any
			if k, b, err = readValue(b); err != nil {
				return nil, nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, nil, fmt.Errorf("key %v", k)
			}
			if _, dup := m[ks]; dup {
				return nil, nil, fmt.Errorf("duplicate key %q", ks)
			}
			if v, b, err = readValue(b); err != nil {
				return nil, nil, err
			}
			m[ks] = v
		}
		return m, b, nil
	case tag == tagArray1:
		a, b, err := readU124(b)
		if err != nil {
			return nil, nil, err
		}
		if a < 2 {
			return nil, nil, fmt.Errorf("1-based array of size %d", a)
		}
		l := make([]any, 0, a-1)
		for range a - 1 {
			var v any
			if v, b, err = readValue(b); err != nil {
				return nil, nil, err
			}
			l = append(l, v)
		}
		return l, b, nil
	}
	return nil, nil, fmt.Errorf("unexpected tag 0x%x", tag)
}

func readU124(b []byte) (uint32, []byte, error) {
	if len(b) == 0 {
		return 0, nil, errors.New("end of data")
	}
	v := uint32(b[0])
	switch {
	case v < 0xe0:
		return v, b[1:], nil
	case v != 0xff:
		if len(b) < 2 {
			return 0, nil, errors.New("short length")
		}
		return (v&0x1f)<<8 + uint32(b[1]) + 0xe0, b[2:], nil
	}
	if len(b) < 5 {
		return 0, nil, errors.New("short length")
	}
	return binary.LittleEndian.Uint32(b[1:]), b[5:], nil
}

// decodeBack reads what FromJSON wrote, whole.
func decodeBack(t testing.TB, ser []byte) any {
	t.Helper()
	v, rest, err := readValue(ser)
	if err != nil {
		t.Fatalf("read back %x: %v", ser, err)
	}
	if len(rest) > 0 {
		t.Fatalf("read back %x: %d trailing bytes", ser, len(rest))
	}
	return v
}

// fromStd is what encoding/json reads from js, in readValue's terms (an
// empty array is an empty table, as cjson decodes it).
func fromStd(v any) any {
	switch x := v.(type) {
	case nil:
		return null{}
	case map[string]any:
		for k, e := range x {
			x[k] = fromStd(e)
		}
		return x
	case []any:
		if len(x) == 0 {
			return map[string]any{}
		}
		for i, e := range x {
			x[i] = fromStd(e)
		}
		return x
	}
	return v
}

func TestGolden(t *testing.T) {
	num := func(f float64) string {
		return "07" + hex.EncodeToString(binary.LittleEndian.AppendUint64(nil, math.Float64bits(f)))
	}
	for _, c := range []struct{ js, want string }{
		{`{}`, "08"},
		{`[]`, "08"},
		{`true`, "02"},
		{`false`, "01"},
		{`null`, "03"},
		{`""`, "20"},
		{`"ab"`, "226162"},
		{`1`, num(1)},
		{`-0`, num(math.Copysign(0, -1))},
		{`98.25`, num(98.25)},
		{`1e400`, num(math.Inf(1))},
		{`{"a":1}`, "0901" + "2161" + num(1)},
		{`[true,false]`, "0c03" + "02" + "01"},
		{` { "k" : [ null ] } `, "0901" + "216b" + "0c02" + "03"},
		{`"\u00e9\ud83d\ude00\n\"\/"`, "29" + "c3a9" + "f09f9880" + "0a222f"},
		{`"\u0000"`, "2100"},
	} {
		got, err := FromJSON(nil, []byte(c.js))
		if err != nil {
			t.Errorf("%s: %v", c.js, err)
			continue
		}
		if hex.EncodeToString(got) != c.want {
			t.Errorf("%s: got %x, want %s", c.js, got, c.want)
		}
	}
}

// Lengths and counts at the edges of the 1-, 2- and 5-byte forms.
func TestLengthForms(t *testing.T) {
	for _, n := range []int{0xdf - tagStr, 0xe0 - tagStr, 0x1fdf - tagStr, 0x1fe0 - tagStr, 70000} {
		s := strings.Repeat("x", n)
		js, _ := json.Marshal(s)
		ser, err := FromJSON(nil, js)
		if err != nil {
			t.Fatal(err)
		}
		if got := decodeBack(t, ser); got != s {
			t.Errorf("string of %d bytes read back as %d", n, len(got.(string)))
		}
		// the same with an escape, which takes the other path
		js, _ = json.Marshal(s[:max(n-1, 0)] + "\n")
		if ser, err = FromJSON(nil, js); err != nil {
			t.Fatal(err)
		}
		if got := decodeBack(t, ser); got != s[:max(n-1, 0)]+"\n" {
			t.Errorf("escaped string of %d bytes differs", n)
		}
	}
	for _, n := range []int{0xde, 0xdf, 0xe0, 0x1fdf, 0x1fe0, 9000} {
		list := make([]int, n)
		obj := map[string]int{}
		for i := range list {
			list[i] = i
			obj[fmt.Sprint("k", i)] = i
		}
		for _, v := range []any{list, obj} {
			js, _ := json.Marshal(v)
			checkSame(t, js)
		}
	}
}

// checkSame: FromJSON's output reads back as encoding/json reads js.
func checkSame(t testing.TB, js []byte) {
	t.Helper()
	ser, err := FromJSON([]byte("prefix"), js)
	if err != nil {
		t.Fatalf("%.80s: %v", js, err)
	}
	if !bytes.HasPrefix(ser, []byte("prefix")) {
		t.Fatalf("dst was not appended to")
	}
	got := decodeBack(t, ser[len("prefix"):])
	var want any
	if err := json.Unmarshal(js, &want); err != nil {
		t.Fatal(err)
	}
	if want = fromStd(want); !reflect.DeepEqual(got, want) {
		t.Fatalf("%.80s: read back %v, want %v", js, got, want)
	}
}

func TestSameAsJSON(t *testing.T) {
	for _, js := range []string{
		`{"id":"1234567890123","name":"Ada Lovelace","email":"ada@example.com","age":36,"active":true,"score":98.25,` +
			`"tags":["math","engines","poetry"],"color":"COLOR_GREEN","avatar":"iVBORw0KGgowMTIzNDU2Nzg5YWJjZGVm",` +
			`"created":"2024-05-06T07:08:09Z"}`,
		`{"a":{"b":{"c":[1,[2,[]],null,{}]}},"n":-1.5e-7,"big":1.7976931348623157e308,"tiny":5e-324}`,
		`[0.1,0.30000000000000004,4294967295,-2147483648,123456789012345678]`,
		`{"esc":"q\"\\\/\b\f\n\r\t\u0001\u007f","é":"ü","":""}`,
	} {
		checkSame(t, []byte(js))
	}
}

func TestErrors(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	for _, js := range []string{
		``, ` `, `{`, `[1,`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1 2]`, `{1:2}`, `tru`, `nul`,
		`01`, `1.`, `.5`, `-`, `1e`, `+1`, `"abc`, `"a\x"`, `"\u12"`, `"\ud83d"`, `"\ude00"`,
		`"\ud83d\u0041"`, "\"a\x01\"", `{} x`, `1 2`, deep,
	} {
		if out, err := FromJSON([]byte("keep"), []byte(js)); err == nil {
			t.Errorf("%.30q: no error", js)
		} else if string(out) != "keep" {
			t.Errorf("%.30q: dst changed to %q on error", js, out)
		}
	}
	if _, err := FromJSON(nil, []byte(`{"a":1,"b":{"a":2},"a":3}`)); !errors.Is(err, ErrDuplicateKey) {
		t.Errorf("duplicate key: %v", err)
	}
	// the same key in two objects is not a duplicate
	checkSame(t, []byte(`{"a":{"a":{"a":1}},"b":{"a":2}}`))
	// the deepest nesting LuaJIT reads
	ok := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if _, err := FromJSON(nil, []byte(ok)); err != nil {
		t.Errorf("%d levels: %v", MaxDepth, err)
	}
}

func FuzzFromJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}]}`, `"\ud83d\ude00"`, `-0.0e+5`, `[[],{}]`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, js []byte) {
		ser, err := FromJSON(nil, js)
		if err != nil {
			return
		}
		if !json.Valid(js) {
			t.Fatalf("accepted invalid JSON %q", js)
		}
		got := decodeBack(t, ser)
		var want any
		if json.Unmarshal(js, &want) != nil {
			return // a number out of float64's range: strtod's ±Inf here
		}
		if !utf8Valid(js) {
			return // encoding/json replaces invalid UTF-8; Lua strings keep bytes
		}
		if want = fromStd(want); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read back %v, want %v", js, got, want)
		}
	})
}

func utf8Valid(b []byte) bool { return strings.ToValidUTF8(string(b), "\uFFFD") == string(b) }

func BenchmarkFromJSONProfile(b *testing.B) {
	js := []byte(`{"id":"1234567890123","name":"Ada Lovelace","email":"ada@example.com","age":36,"active":true,` +
		`"score":98.25,"tags":["math","engines","poetry"],"color":"COLOR_GREEN",` +
		`"avatar":"iVBORw0KGgowMTIzNDU2Nzg5YWJjZGVm","created":"2024-05-06T07:08:09Z"}`)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = FromJSON(buf[:0], js); err != nil {
			b.Fatal(err)
		}
	}
}
