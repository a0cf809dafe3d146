package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
)

// The JSON gateway and the raw baseline must carry the same message: the
// JSON and the protobuf bytes decode to the benchmark's Profile, every
// field set, and the JSON wrk posts is compact.
func TestProfileDataSameMessage(t *testing.T) {
	js, pb, err := profileData()
	if err != nil {
		t.Fatal(err)
	}
	var fromJSON, fromPB demopb.Profile
	if err := protojson.Unmarshal(js, &fromJSON); err != nil {
		t.Fatalf("JSON %s: %v", js, err)
	}
	if err := proto.Unmarshal(pb, &fromPB); err != nil {
		t.Fatalf("protobuf %x: %v", pb, err)
	}
	want := benchProfile()
	if !proto.Equal(&fromJSON, want) || !proto.Equal(&fromPB, want) {
		t.Fatalf("JSON gives %v, protobuf %v, want %v", &fromJSON, &fromPB, want)
	}
	n := 0
	want.ProtoReflect().Range(func(protoreflect.FieldDescriptor, protoreflect.Value) bool { n++; return true })
	if n != 10 {
		t.Fatalf("%d fields set, want the 10 of demo.Profile", n)
	}
	if bytes.ContainsAny(bytes.ReplaceAll(js, []byte("Ada Lovelace"), nil), " \n\t") {
		t.Fatalf("JSON not compact: %s", js)
	}
}

// luaUnquote reads back what luaQuote writes, as Lua does.
func luaUnquote(t *testing.T, s string) []byte {
	t.Helper()
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		t.Fatalf("not a quoted string: %q", s)
	}
	var out []byte
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		switch {
		case c == '\\':
			if i+3 >= len(s) {
				t.Fatalf("short escape at %d in %q", i, s)
			}
			v, err := strconv.Atoi(s[i+1 : i+4])
			if err != nil || v > 255 {
				t.Fatalf("bad escape %q", s[i:i+4])
			}
			out = append(out, byte(v))
			i += 3
		case c == '"' || c < 0x20 || c >= 0x7f:
			t.Fatalf("raw byte %#x in a Lua literal: %q", c, s)
		default:
			out = append(out, c)
		}
	}
	return out
}

func TestLuaQuote(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	// \ddd followed by a digit must stay three digits: "\0011" is \001 then 1.
	for _, in := range [][]byte{all, []byte("\x011\"\\"), nil} {
		q := luaQuote(in)
		if got := luaUnquote(t, q); !bytes.Equal(got, in) {
			t.Errorf("luaQuote(%q) = %s reads back as %q", in, q, got)
		}
	}
	if got := luaQuote([]byte("a\"b")); got != `"a\034b"` {
		t.Errorf(`luaQuote("a\"b") = %s`, got)
	}
}

// The cost added is the median of the per-run differences (each run
// measures both modes interleaved), not the difference of the medians,
// and is held against the 10 µs target.
func TestAddedRow(t *testing.T) {
	r := addedRow("x", []float64{300, 100, 120}, []float64{290, 95, 100})
	if r.ratio != 10 || !r.met || r.section != secProtoAdded || r.target != protoTarget {
		t.Fatalf("paired median: got ratio %v met %v section %q target %q, want 10, met", r.ratio, r.met, r.section, r.target)
	}
	if !strings.Contains(r.markdown(), "| x (runs 5.0–20.0) | 10.0 µs | — | 10.00 µs added | ≤ 10 (met) |") {
		t.Errorf("markdown: %s", r.markdown())
	}
	r = addedRow("y", []float64{130}, []float64{100})
	if r.ratio != 30 || r.met {
		t.Fatalf("30 µs added: ratio %v met %v, want 30, missed", r.ratio, r.met)
	}
	r = addedRow("z", []float64{95}, []float64{100})
	if r.ratio != -5 || !r.met {
		t.Fatalf("noise below zero: ratio %v met %v, want -5, met", r.ratio, r.met)
	}
}
