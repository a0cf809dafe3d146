package transcode

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

// checkDecodeLua compares DecodeLua with what it replaces, FromJSON of
// Decode's text, for one input and both namings. It returns whether the
// direct path took every naming (it may leave an input to the JSON path,
// never give other bytes).
func checkDecodeLua(t testing.TB, m *Message, pb []byte) bool {
	took := true
	for _, names := range []bool{false, true} {
		o := DecodeOptions{ProtoNames: names}
		got, ok := m.DecodeLua([]byte{0}, pb, o)
		js, err := m.Decode(nil, pb, o)
		if err != nil {
			if ok {
				t.Fatalf("proto_names=%v: DecodeLua took %x, which Decode refuses: %v", names, pb, err)
			}
			took = false
			continue
		}
		want, ferr := luaserial.FromJSON([]byte{0}, js)
		if !ok {
			took = false
			continue
		}
		if ferr != nil {
			t.Fatalf("proto_names=%v: DecodeLua took %x, whose JSON %s FromJSON refuses: %v", names, pb, js, ferr)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("proto_names=%v: bytes differ for JSON %s:\n direct  %x\n via JSON %x", names, js, got, want)
		}
	}
	return took
}

// The ordinary messages must take the direct path: a decoder that always
// gave up would pass the comparison and save nothing.
func TestDecodeLuaMatchesJSONPath(t *testing.T) {
	r := demoRegistry(t)
	all := mustMessage(t, r, "demo.AllKinds")
	nan := float32(math.NaN())
	many := make([]*demopb.AllKinds_Inner, 300) // a list longer than the table header's short count form
	for i := range many {
		many[i] = &demopb.AllKinds_Inner{Id: "n"}
	}
	cases := []struct {
		m   *Message
		msg proto.Message
	}{
		{all, fullAllKinds()},
		{all, &demopb.AllKinds{}},
		{all, &demopb.AllKinds{Fl: 0.1, Db: -0.0, Ratios: []float64{math.Inf(1), math.NaN(), 1e-7, 1e21}}},
		{all, &demopb.AllKinds{Fl: nan, F32: 1, U64: 1 << 63, Color: demopb.Color(-5), Colors: []demopb.Color{42}}},
		{all, &demopb.AllKinds{Text: "tab\tquote\" back\\ nl\n \x01", Labels: map[string]string{"é\n": "\"", "": "x"}}},
		{all, &demopb.AllKinds{ById: map[int32]*demopb.AllKinds_Inner{0: {}}, Blobs: map[bool][]byte{false: {}}}},
		{all, &demopb.AllKinds{Choice: &demopb.AllKinds_ChoiceText{}}},
		{all, &demopb.AllKinds{Value: structpb.NewNullValue(), Items: many}},
		{mustMessage(t, r, "demo.Profile"), profile()},
	}
	for i, c := range cases {
		pb, err := proto.Marshal(c.msg)
		if err != nil {
			t.Fatal(err)
		}
		if !checkDecodeLua(t, c.m, pb) {
			t.Errorf("case %d: DecodeLua left an ordinary message to the JSON path", i)
		}
	}
}

// Deeper than LuaJIT decodes: both ways must agree, and both leave it to
// JSON (FromJSON refuses it).
func TestDecodeLuaDepth(t *testing.T) {
	r := demoRegistry(t)
	m := mustMessage(t, r, "demo.AllKinds")
	in := &demopb.AllKinds_Inner{Id: "leaf"}
	for i := 0; i < 120; i++ {
		in = &demopb.AllKinds_Inner{Child: in}
	}
	pb, err := proto.Marshal(&demopb.AllKinds{Inner: in})
	if err != nil {
		t.Fatal(err)
	}
	if checkDecodeLua(t, m, pb) {
		t.Fatal("DecodeLua took a message nested 120 deep")
	}
}

// FuzzDecodeLua: on any input, DecodeLua gives FromJSON(Decode()) byte for
// byte or leaves it to them. Its corpus starts with FuzzDecode's.
func FuzzDecodeLua(f *testing.F) {
	for _, m := range []proto.Message{fullAllKinds(), profile(), &demopb.AllKinds{Fl: 0.1}} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	files, _ := filepath.Glob("testdata/fuzz/FuzzDecode/*")
	for _, name := range files {
		if pb, ok := readCorpusBytes(name); ok {
			f.Add(pb)
		}
	}
	r := demoRegistry(f)
	m := mustMessage(f, r, "demo.AllKinds")
	f.Fuzz(func(t *testing.T, pb []byte) {
		checkDecodeLua(t, m, pb)
	})
}

// readCorpusBytes reads a "go test fuzz v1" file holding one []byte.
func readCorpusBytes(name string) ([]byte, bool) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, false
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) != 2 || !bytes.HasPrefix(lines[1], []byte("[]byte(")) {
		return nil, false
	}
	v, err := strconv.Unquote(string(bytes.TrimSuffix(bytes.TrimPrefix(lines[1], []byte("[]byte(")), []byte(")"))))
	return []byte(v), err == nil
}

// The response side of a table-mode call: the direct path against the
// JSON text and FromJSON it replaces, with warm caches and (Cold) after
// evicting them, as between two sequential calls in an nginx worker.
func benchDecodeLua(b *testing.B, direct, cold bool) {
	m, _, pb := benchInputs(b)
	js := make([]byte, 0, 512)
	ser := make([]byte, 0, 512)
	o := DecodeOptions{ProtoNames: true}
	b.ReportAllocs()
	for b.Loop() {
		if cold {
			b.StopTimer()
			evict()
			b.StartTimer()
		}
		if direct {
			var ok bool
			if ser, ok = m.DecodeLua(ser[:0], pb, o); !ok {
				b.Fatal("DecodeLua gave up")
			}
			continue
		}
		var err error
		if js, err = m.Decode(js[:0], pb, o); err != nil {
			b.Fatal(err)
		}
		if ser, err = luaserial.FromJSON(ser[:0], js); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeLuaProfile(b *testing.B)            { benchDecodeLua(b, true, false) }
func BenchmarkDecodeLuaProfileViaJSON(b *testing.B)     { benchDecodeLua(b, false, false) }
func BenchmarkDecodeLuaProfileCold(b *testing.B)        { benchDecodeLua(b, true, true) }
func BenchmarkDecodeLuaProfileViaJSONCold(b *testing.B) { benchDecodeLua(b, false, true) }

// Strings are checked once, as they are read: a StringValue's too (the
// wrapper is the one reader outside message and mapValue). An Any goes
// through protojson inside the table.
func TestDecodeLuaWrappersAndAny(t *testing.T) {
	r := NewRegistry()
	dir := writeFiles(t, map[string]string{"w.proto": `syntax = "proto3"; package w;
import "google/protobuf/wrappers.proto"; import "google/protobuf/any.proto";
message W { google.protobuf.StringValue s = 1; google.protobuf.Any a = 2; repeated string l = 3; }`})
	if err := r.LoadFile(filepath.Join(dir, "w.proto"), nil); err != nil {
		t.Fatal(err)
	}
	m := mustMessage(t, r, "w.W")
	good := []byte("\x0a\x04\x0a\x02ok\x1a\x01x")
	if !checkDecodeLua(t, m, good) {
		t.Fatal("DecodeLua left a valid StringValue to the JSON path")
	}
	for _, bad := range [][]byte{
		[]byte("\x0a\x03\x0a\x01\xff"),  // StringValue
		[]byte("\x1a\x01\xff\x1a\x01x"), // a list element
	} {
		if _, ok := m.DecodeLua(nil, bad, DecodeOptions{}); ok {
			t.Errorf("DecodeLua took invalid UTF-8: %x", bad)
		}
		checkDecodeLua(t, m, bad)
	}
	a, err := anypb.New(durationpb.New(1500 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := proto.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	withAny := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), inner)
	if !checkDecodeLua(t, m, withAny) {
		t.Fatal("DecodeLua left an Any to the JSON path")
	}
}
