package transcode

import (
	"bytes"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

// luaSeeds are tables serialized by a real LuaJIT's string.buffer, by
// message type (testdata/lua_seeds.txt: "type hex" lines).
func luaSeeds(t testing.TB) (types []string, sers [][]byte) {
	b, err := os.ReadFile("testdata/lua_seeds.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		typ, h, _ := strings.Cut(line, " ")
		ser, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		types, sers = append(types, typ), append(sers, ser)
	}
	return types, sers
}

// viaJSON is the request path EncodeLua must agree with
// (internal/bridge): the table as the Lua module's JSON text, its marks
// checked, then Encode.
func viaJSON(m *Message, ser []byte) ([]byte, error) {
	js, marks, err := luaserial.ToJSONMarked(nil, ser, nil)
	if err != nil {
		return nil, err
	}
	if js, err = m.CheckLuaMarks(js, marks); err != nil {
		return nil, err
	}
	return m.Encode(nil, js, EncodeOptions{})
}

// The direct path gives the JSON path's bytes, and takes the common
// tables itself (the benchmark's Profile, most of AllKinds): a fast path
// that always gave up would pass the first check and lose its point.
func TestEncodeLuaMatchesJSONPath(t *testing.T) {
	r := demoRegistry(t)
	types, sers := luaSeeds(t)
	wantFast := []bool{true, true, false, false, false, true, true}
	if len(types) != len(wantFast) {
		t.Fatalf("%d seeds, want %d", len(types), len(wantFast))
	}
	for i, ser := range sers {
		m := mustMessage(t, r, types[i])
		out, ok := m.EncodeLua([]byte("keep"), ser)
		if ok != wantFast[i] {
			t.Errorf("seed %d (%s): fast path %v, want %v", i, types[i], ok, wantFast[i])
		}
		want, err := viaJSON(m, ser)
		if !ok {
			if string(out) != "keep" {
				t.Errorf("seed %d: gave up but wrote %q", i, out)
			}
			continue
		}
		if err != nil || !bytes.Equal(out[4:], want) || string(out[:4]) != "keep" {
			t.Errorf("seed %d: direct %x, via JSON %x (%v)", i, out, want, err)
		}
	}
}

// Whatever the bytes: no panic, and when the direct path answers, the
// JSON path answers the same bytes.
func FuzzEncodeLua(f *testing.F) {
	_, sers := luaSeeds(f)
	for _, s := range sers {
		f.Add(s)
	}
	r := demoRegistry(f)
	m := mustMessage(f, r, "demo.AllKinds")
	f.Fuzz(func(t *testing.T, ser []byte) {
		out, ok := m.EncodeLua(nil, ser)
		want, err := viaJSON(m, ser)
		if !ok {
			return
		}
		if err != nil || !bytes.Equal(out, want) {
			t.Fatalf("direct %x; via JSON %x, %v", out, want, err)
		}
	})
}

func BenchmarkEncodeLuaProfile(b *testing.B) {
	r := demoRegistry(b)
	m := mustMessage(b, r, "demo.Profile")
	_, sers := luaSeeds(b)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var ok bool
		if buf, ok = m.EncodeLua(buf[:0], sers[0]); !ok {
			b.Fatal("not taken")
		}
	}
}

func BenchmarkEncodeLuaProfileViaJSON(b *testing.B) {
	r := demoRegistry(b)
	m := mustMessage(b, r, "demo.Profile")
	_, sers := luaSeeds(b)
	js, out := make([]byte, 0, 512), make([]byte, 0, 512)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		if js, err = luaserial.ToJSON(js[:0], sers[0]); err != nil {
			b.Fatal(err)
		}
		if out, err = m.Encode(out[:0], js, EncodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
