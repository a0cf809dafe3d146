package transcode

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
)

const greeterProto = "../../demo/proto/greeter.proto"

func demoRegistry(t testing.TB) *Registry {
	t.Helper()
	r := NewRegistry()
	if err := r.LoadFile(greeterProto, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

func mustMessage(t testing.TB, r *Registry, name string) *Message {
	t.Helper()
	m, err := r.Message(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Every field kind: JSON in, protobuf bytes (checked with the generated Go
// code), JSON out (the canonical proto3 JSON form).
func TestRoundTripFieldKinds(t *testing.T) {
	r := demoRegistry(t)
	m := mustMessage(t, r, "demo.AllKinds")
	cases := []struct {
		name      string
		in, out   string // out "" means the same as in
		check     func(*demopb.AllKinds) bool
		protoName string // out with ProtoNames, if it differs from out
	}{
		{"int32 max", `{"i32":2147483647}`, "", func(x *demopb.AllKinds) bool { return x.I32 == math.MaxInt32 }, ""},
		{"int32 min", `{"i32":-2147483648}`, "", func(x *demopb.AllKinds) bool { return x.I32 == math.MinInt32 }, ""},
		{"int32 from string", `{"i32":"-7"}`, `{"i32":-7}`, func(x *demopb.AllKinds) bool { return x.I32 == -7 }, ""},
		{"int32 from exponent", `{"i32":1e3}`, `{"i32":1000}`, func(x *demopb.AllKinds) bool { return x.I32 == 1000 }, ""},
		{"int64 max", `{"i64":"9223372036854775807"}`, "", func(x *demopb.AllKinds) bool { return x.I64 == math.MaxInt64 }, ""},
		{"int64 min", `{"i64":"-9223372036854775808"}`, "", func(x *demopb.AllKinds) bool { return x.I64 == math.MinInt64 }, ""},
		{"int64 from number", `{"i64":12345}`, `{"i64":"12345"}`, func(x *demopb.AllKinds) bool { return x.I64 == 12345 }, ""},
		{"uint32 max", `{"u32":4294967295}`, "", func(x *demopb.AllKinds) bool { return x.U32 == math.MaxUint32 }, ""},
		{"uint64 max", `{"u64":"18446744073709551615"}`, "", func(x *demopb.AllKinds) bool { return x.U64 == math.MaxUint64 }, ""},
		{"sint32 min", `{"s32":-2147483648}`, "", func(x *demopb.AllKinds) bool { return x.S32 == math.MinInt32 }, ""},
		{"sint64 min", `{"s64":"-9223372036854775808"}`, "", func(x *demopb.AllKinds) bool { return x.S64 == math.MinInt64 }, ""},
		{"fixed32 max", `{"f32":4294967295}`, "", func(x *demopb.AllKinds) bool { return x.F32 == math.MaxUint32 }, ""},
		{"fixed64 max", `{"f64":"18446744073709551615"}`, "", func(x *demopb.AllKinds) bool { return x.F64 == math.MaxUint64 }, ""},
		{"sfixed32 min", `{"sf32":-2147483648}`, "", func(x *demopb.AllKinds) bool { return x.Sf32 == math.MinInt32 }, ""},
		{"sfixed64 max", `{"sf64":"9223372036854775807"}`, "", func(x *demopb.AllKinds) bool { return x.Sf64 == math.MaxInt64 }, ""},
		{"float", `{"fl":1.5}`, "", func(x *demopb.AllKinds) bool { return x.Fl == 1.5 }, ""},
		{"float max", `{"fl":3.4028235e+38}`, "", func(x *demopb.AllKinds) bool { return x.Fl == math.MaxFloat32 }, ""},
		{"float NaN", `{"fl":"NaN"}`, "", func(x *demopb.AllKinds) bool { return math.IsNaN(float64(x.Fl)) }, ""},
		{"float -Infinity", `{"fl":"-Infinity"}`, "", func(x *demopb.AllKinds) bool { return math.IsInf(float64(x.Fl), -1) }, ""},
		{"double", `{"db":-0.1}`, "", func(x *demopb.AllKinds) bool { return x.Db == -0.1 }, ""},
		{"double smallest", `{"db":5e-324}`, "", func(x *demopb.AllKinds) bool { return x.Db == math.SmallestNonzeroFloat64 }, ""},
		{"double Infinity", `{"db":"Infinity"}`, "", func(x *demopb.AllKinds) bool { return math.IsInf(x.Db, 1) }, ""},
		{"double NaN", `{"db":"NaN"}`, "", func(x *demopb.AllKinds) bool { return math.IsNaN(x.Db) }, ""},
		{"double from string", `{"db":"2.5"}`, `{"db":2.5}`, func(x *demopb.AllKinds) bool { return x.Db == 2.5 }, ""},
		{"bool", `{"flag":true}`, "", func(x *demopb.AllKinds) bool { return x.Flag }, ""},
		{"string", `{"text":"héllo \"q\" \u0000"}`, `{"text":"héllo \"q\" \u0000"}`, func(x *demopb.AllKinds) bool { return x.Text == "héllo \"q\" \x00" }, ""},
		{"bytes", `{"data":"AP8Q"}`, "", func(x *demopb.AllKinds) bool { return bytes.Equal(x.Data, []byte{0, 0xff, 0x10}) }, ""},
		{"bytes url-safe in", `{"data":"_-8"}`, `{"data":"/+8="}`, func(x *demopb.AllKinds) bool { return bytes.Equal(x.Data, []byte{0xff, 0xef}) }, ""},
		{"enum by name", `{"color":"COLOR_BLUE"}`, "", func(x *demopb.AllKinds) bool { return x.Color == demopb.Color_COLOR_BLUE }, ""},
		{"enum by number", `{"color":2}`, `{"color":"COLOR_GREEN"}`, func(x *demopb.AllKinds) bool { return x.Color == demopb.Color_COLOR_GREEN }, ""},
		{"enum unknown number", `{"color":77}`, "", func(x *demopb.AllKinds) bool { return x.Color == 77 }, ""},
		{"nested", `{"inner":{"id":"a","values":[1,-2],"child":{"id":"b"}}}`, "", func(x *demopb.AllKinds) bool {
			return x.GetInner().GetId() == "a" && len(x.GetInner().GetValues()) == 2 && x.GetInner().GetValues()[1] == -2 && x.GetInner().GetChild().GetId() == "b"
		}, ""},
		{"repeated string", `{"tags":["x","","y"]}`, "", func(x *demopb.AllKinds) bool { return len(x.Tags) == 3 && x.Tags[1] == "" && x.Tags[2] == "y" }, ""},
		{"repeated message", `{"items":[{"id":"1"},{}]}`, "", func(x *demopb.AllKinds) bool { return len(x.Items) == 2 && x.Items[0].Id == "1" }, ""},
		{"repeated int64", `{"big":["-9223372036854775808","0","9223372036854775807"]}`, "", func(x *demopb.AllKinds) bool {
			return len(x.Big) == 3 && x.Big[0] == math.MinInt64 && x.Big[2] == math.MaxInt64
		}, ""},
		{"repeated enum", `{"colors":["COLOR_RED","COLOR_UNSPECIFIED"]}`, "", func(x *demopb.AllKinds) bool { return len(x.Colors) == 2 && x.Colors[0] == demopb.Color_COLOR_RED }, ""},
		{"repeated double", `{"ratios":[0.5,"NaN",-1]}`, "", func(x *demopb.AllKinds) bool { return len(x.Ratios) == 3 && math.IsNaN(x.Ratios[1]) }, ""},
		{"map string int64", `{"counts":{"a":"1","b":"-9223372036854775808"}}`, "", func(x *demopb.AllKinds) bool { return x.Counts["a"] == 1 && x.Counts["b"] == math.MinInt64 }, ""},
		{"map int32 message", `{"byId":{"-1":{"id":"neg"},"7":{"id":"seven"}}}`, "", func(x *demopb.AllKinds) bool { return x.ById[-1].GetId() == "neg" && x.ById[7].GetId() == "seven" }, `{"by_id":{"-1":{"id":"neg"},"7":{"id":"seven"}}}`},
		{"map by proto name", `{"by_id":{"3":{}}}`, `{"byId":{"3":{}}}`, func(x *demopb.AllKinds) bool { _, ok := x.ById[3]; return ok }, `{"by_id":{"3":{}}}`},
		{"map bool bytes", `{"blobs":{"false":"","true":"AQ=="}}`, "", func(x *demopb.AllKinds) bool { return len(x.Blobs) == 2 && bytes.Equal(x.Blobs[true], []byte{1}) }, ""},
		{"oneof string", `{"choiceText":"t"}`, "", func(x *demopb.AllKinds) bool { return x.GetChoiceText() == "t" }, `{"choice_text":"t"}`},
		{"oneof int64 zero", `{"choiceNum":"0"}`, "", func(x *demopb.AllKinds) bool { _, ok := x.Choice.(*demopb.AllKinds_ChoiceNum); return ok }, `{"choice_num":"0"}`},
		{"oneof message", `{"choice_inner":{"id":"c"}}`, `{"choiceInner":{"id":"c"}}`, func(x *demopb.AllKinds) bool { return x.GetChoiceInner().GetId() == "c" }, `{"choice_inner":{"id":"c"}}`},
		{"timestamp", `{"at":"2024-02-29T23:59:59.123456789Z"}`, "", func(x *demopb.AllKinds) bool {
			return x.At.AsTime().Equal(time.Date(2024, 2, 29, 23, 59, 59, 123456789, time.UTC))
		}, ""},
		{"timestamp with offset", `{"at":"2024-01-01T01:00:00+01:00"}`, `{"at":"2024-01-01T00:00:00Z"}`, func(x *demopb.AllKinds) bool { return x.At.GetSeconds() == 1704067200 }, ""},
		{"duration", `{"took":"-1.500s"}`, `{"took":"-1.500s"}`, func(x *demopb.AllKinds) bool { return x.Took.AsDuration() == -1500*time.Millisecond }, ""},
		{"struct", `{"meta":{"a":1,"b":[true,null,"s"],"c":{"d":{}}}}`, "", func(x *demopb.AllKinds) bool {
			return x.Meta.Fields["a"].GetNumberValue() == 1 && x.Meta.Fields["b"].GetListValue().Values[1].GetNullValue() == structpb.NullValue_NULL_VALUE
		}, ""},
		{"value null", `{"value":null}`, "", func(x *demopb.AllKinds) bool { _, ok := x.Value.GetKind().(*structpb.Value_NullValue); return ok }, ""},
		{"value string", `{"value":"v"}`, "", func(x *demopb.AllKinds) bool { return x.Value.GetStringValue() == "v" }, ""},
		{"wrapper", `{"wrapped":"-5"}`, "", func(x *demopb.AllKinds) bool { return x.Wrapped.GetValue() == -5 }, ""},
		{"wrapper zero is present", `{"wrapped":"0"}`, "", func(x *demopb.AllKinds) bool { return x.Wrapped != nil && x.Wrapped.Value == 0 }, ""},
		{"optional zero is present", `{"maybe":0}`, "", func(x *demopb.AllKinds) bool { return x.Maybe != nil && *x.Maybe == 0 }, ""},
		{"defaults left out", `{"i32":0,"text":"","tags":[],"flag":false}`, `{}`, func(x *demopb.AllKinds) bool { return proto.Equal(x, &demopb.AllKinds{}) }, ""},
		{"nulls are unset", `{"i64":null,"inner":null,"tags":null,"counts":null,"at":null}`, `{}`, func(x *demopb.AllKinds) bool { return proto.Equal(x, &demopb.AllKinds{}) }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pb, err := m.Encode(nil, []byte(c.in), EncodeOptions{})
			if err != nil {
				t.Fatalf("encode %s: %v", c.in, err)
			}
			var gen demopb.AllKinds
			if err := proto.Unmarshal(pb, &gen); err != nil {
				t.Fatalf("generated code cannot read our bytes %x: %v", pb, err)
			}
			if !c.check(&gen) {
				t.Fatalf("generated code read %v from %s", &gen, c.in)
			}
			want := c.out
			if want == "" {
				want = c.in
			}
			js, err := m.Decode(nil, pb, DecodeOptions{})
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if string(js) != want {
				t.Fatalf("round trip of %s gave %s, want %s", c.in, js, want)
			}
			if c.protoName != "" {
				js, err := m.Decode(nil, pb, DecodeOptions{ProtoNames: true})
				if err != nil || string(js) != c.protoName {
					t.Fatalf("proto names: %s, %v; want %s", js, err, c.protoName)
				}
			}
			// Bytes from the generated code decode to the same JSON.
			genPB, err := proto.MarshalOptions{Deterministic: true}.Marshal(&gen)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(genPB, pb) {
				t.Fatalf("bytes differ from the generated code's:\n ours %x\n gen  %x", pb, genPB)
			}
		})
	}
}

// fullAllKinds sets every field (one oneof member) through the generated code.
func fullAllKinds() *demopb.AllKinds {
	maybe := int32(-3)
	meta, err := structpb.NewStruct(map[string]any{"n": 1.25, "s": "x", "l": []any{true, nil}, "o": map[string]any{"k": "v"}})
	if err != nil {
		panic(err)
	}
	return &demopb.AllKinds{
		I32: math.MinInt32, I64: math.MinInt64, U32: math.MaxUint32, U64: math.MaxUint64,
		S32: -1, S64: math.MaxInt64, F32: 7, F64: math.MaxUint64, Sf32: math.MinInt32, Sf64: -9,
		Fl: float32(math.Inf(-1)), Db: math.Pi, Flag: true, Text: "ünïcode ☃", Data: []byte{0, 1, 2, 0xfe, 0xff},
		Color:   demopb.Color_COLOR_RED,
		Inner:   &demopb.AllKinds_Inner{Id: "i", Values: []int32{-1, 0, math.MaxInt32}, Child: &demopb.AllKinds_Inner{Id: "c"}},
		Tags:    []string{"a", "b"},
		Items:   []*demopb.AllKinds_Inner{{Id: "x"}, {Values: []int32{5}}},
		Big:     []int64{math.MinInt64, math.MaxInt64},
		Colors:  []demopb.Color{demopb.Color_COLOR_BLUE, demopb.Color_COLOR_GREEN},
		Ratios:  []float64{0.1, math.MaxFloat64},
		Counts:  map[string]int64{"z": 1, "a": -1, "m": math.MaxInt64},
		ById:    map[int32]*demopb.AllKinds_Inner{3: {Id: "three"}, -8: {Id: "minus"}, 100: {}},
		Labels:  map[string]string{"k1": "v1", "k2": ""},
		Blobs:   map[bool][]byte{true: {1}, false: nil},
		Choice:  &demopb.AllKinds_ChoiceInner{ChoiceInner: &demopb.AllKinds_Inner{Id: "chosen"}},
		At:      timestamppb.New(time.Date(1970, 1, 1, 0, 0, 0, 1, time.UTC)),
		Took:    durationpb.New(90 * time.Minute),
		Meta:    meta,
		Value:   structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewNumberValue(1)}}),
		Wrapped: wrapperspb.Int64(math.MinInt64),
		Maybe:   &maybe,
	}
}

// Interop both ways with the generated code, byte-exact: ours encodes what
// protoc-gen-go's code encodes, and decodes what it encodes.
func TestInteropGenerated(t *testing.T) {
	r := demoRegistry(t)
	m := mustMessage(t, r, "demo.AllKinds")
	gen := fullAllKinds()
	genPB, err := proto.MarshalOptions{Deterministic: true}.Marshal(gen)
	if err != nil {
		t.Fatal(err)
	}
	genJSON, err := protojson.Marshal(gen)
	if err != nil {
		t.Fatal(err)
	}

	// JSON -> our bytes == generated bytes.
	ours, err := m.Encode(nil, genJSON, EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, genPB) {
		t.Fatalf("encoded bytes differ:\n ours %x\n gen  %x", ours, genPB)
	}

	// Generated bytes -> our JSON -> generated message equal to the original.
	js, err := m.Decode(nil, genPB, DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var back demopb.AllKinds
	if err := protojson.Unmarshal(js, &back); err != nil {
		t.Fatalf("generated code cannot read our JSON %s: %v", js, err)
	}
	if !proto.Equal(&back, gen) {
		t.Fatalf("decoded message differs:\n got  %v\n want %v", &back, gen)
	}
	// And our JSON with proto names reads back the same.
	js, err = m.Decode(nil, genPB, DecodeOptions{ProtoNames: true})
	if err != nil {
		t.Fatal(err)
	}
	back.Reset()
	if err := protojson.Unmarshal(js, &back); err != nil || !proto.Equal(&back, gen) {
		t.Fatalf("proto-names JSON %s read back as %v (%v)", js, &back, err)
	}
	if !bytes.Contains(js, []byte(`"by_id"`)) {
		t.Fatalf("proto names not used: %s", js)
	}

	// Output is compact: no whitespace outside strings.
	var compact bytes.Buffer
	if err := json.Compact(&compact, js); err != nil {
		t.Fatal(err)
	}
	if compact.String() != string(js) {
		t.Fatalf("output not compact:\n %s", js)
	}
}

func TestDecodeEmitDefaults(t *testing.T) {
	r := demoRegistry(t)
	m := mustMessage(t, r, "demo.HelloReply")
	js, err := m.Decode(nil, nil, DecodeOptions{EmitDefaults: true})
	if err != nil || string(js) != `{"message":""}` {
		t.Fatalf("got %s, %v", js, err)
	}
	js, err = m.Decode(nil, nil, DecodeOptions{})
	if err != nil || string(js) != `{}` {
		t.Fatalf("got %s, %v", js, err)
	}
}

// Encode and Decode append to dst and leave it alone on error.
func TestAppend(t *testing.T) {
	r := demoRegistry(t)
	m := mustMessage(t, r, "demo.HelloRequest")
	out, err := m.Encode([]byte("pre"), []byte(`{"name":"x"}`), EncodeOptions{})
	if err != nil || string(out) != "pre\x0a\x01x" {
		t.Fatalf("encode: %q, %v", out, err)
	}
	out, err = m.Decode([]byte("pre"), []byte("\x0a\x01x"), DecodeOptions{})
	if err != nil || string(out) != `pre{"name":"x"}` {
		t.Fatalf("decode: %q, %v", out, err)
	}
	out, err = m.Encode([]byte("pre"), []byte(`{"nope":1}`), EncodeOptions{})
	if err == nil || string(out) != "pre" {
		t.Fatalf("encode error: %q, %v", out, err)
	}
}

func TestCompactJSON(t *testing.T) {
	in := `{"a": 1, "b": "x, \"y\" z\\", "c": [1, 2]}`
	want := `{"a":1,"b":"x, \"y\" z\\","c":[1,2]}`
	if got := string(compactJSON([]byte(in))); got != want {
		t.Fatalf("got %s", got)
	}
}

// The fast decoder handles the demo messages itself (no fallback) and
// writes what protojson writes.
func TestFastDecodeMatchesProtojson(t *testing.T) {
	r := demoRegistry(t)
	msgs := []proto.Message{fullAllKinds(), profile(), &demopb.AllKinds{}, &demopb.AllKinds{Fl: float32(math.Copysign(0, -1)), Db: 1e-7, Ratios: []float64{1e21, -1e-300}}}
	for _, gen := range msgs {
		m := mustMessage(t, r, string(gen.ProtoReflect().Descriptor().FullName()))
		pb, err := proto.Marshal(gen)
		if err != nil {
			t.Fatal(err)
		}
		for _, names := range []bool{false, true} {
			for _, emit := range []bool{false, true} {
				fd := fastDecoder{reg: r, protoNames: names, emit: emit}
				fast, ok := fd.message(nil, m.plan, pb)
				if !ok {
					t.Fatalf("%T: fast path gave up", gen)
				}
				slow, err := m.decodeSlow(nil, pb, DecodeOptions{ProtoNames: names, EmitDefaults: emit})
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(fast, slow) {
					t.Fatalf("emit %v: fast and protojson differ:\n fast %s\n slow %s", emit, fast, slow)
				}
			}
		}
	}
}
