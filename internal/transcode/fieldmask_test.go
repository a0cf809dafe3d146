package transcode

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

const maskProto = `syntax = "proto3"; package fm;
import "google/protobuf/field_mask.proto";
message Holder {
  google.protobuf.FieldMask mask = 1;
  Holder child = 2;
  repeated Holder items = 3;
  map<string, Holder> by_name = 4;
  repeated google.protobuf.FieldMask masks = 5;
  map<int32, google.protobuf.FieldMask> mask_by_id = 6;
  oneof pick { google.protobuf.FieldMask picked = 7; string other = 8; }
  int32 n = 9;
}`

func maskRegistry(t *testing.T) *Registry {
	t.Helper()
	dir := writeFiles(t, map[string]string{"fm.proto": maskProto})
	r := NewRegistry()
	if err := r.LoadFile(filepath.Join(dir, "fm.proto"), nil); err != nil {
		t.Fatal(err)
	}
	return r
}

// wantMask is the encoding of the message given in txt (protobuf text
// format, where a FieldMask's paths are plain strings).
func wantMask(t *testing.T, m *Message, txt string) []byte {
	t.Helper()
	msg := dynamicpb.NewMessage(m.desc)
	if err := prototext.Unmarshal([]byte(txt), msg); err != nil {
		t.Fatalf("%s: %v", txt, err)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFieldMaskMessageForm: a FieldMask given as {"paths": [...]} keeps
// its paths as written (en_GB, Num, STATUS, a Struct key), wherever the
// mask sits, on the fast path and on protojson's (the slow path, which
// a null elsewhere in the message sends the call to); the string form
// reads as protojson reads it.
func TestFieldMaskMessageForm(t *testing.T) {
	r := maskRegistry(t)
	m := mustMessage(t, r, "fm.Holder")
	for _, tc := range []struct{ in, want string }{
		{`{"mask":{"paths":["en_GB","Num","STATUS","thing.subThing.sub_value"]}}`,
			`mask { paths: "en_GB" paths: "Num" paths: "STATUS" paths: "thing.subThing.sub_value" }`},
		{`{"mask":{}}`, `mask {}`},
		{`{"mask":{"paths":[]}}`, `mask {}`},
		{` { "mask" : { "paths" : [ "a" , "b.c" ] } } `, `mask { paths: "a" paths: "b.c" }`},
		{`{"mask":{"\u0070aths":["x\u00e9"]}}`, `mask { paths: "xé" }`},
		{`{"child":{"child":{"mask":{"paths":["line_num"]}}}}`, `child { child { mask { paths: "line_num" } } }`},
		{`{"items":[{},{"mask":{"paths":["a_B"]}},{"n":3}]}`, `items {} items { mask { paths: "a_B" } } items { n: 3 }`},
		{`{"byName":{"k":{"mask":{"paths":["Z"]}},"j":{"n":1}}}`,
			`by_name { key: "j" value { n: 1 } } by_name { key: "k" value { mask { paths: "Z" } } }`},
		{`{"masks":[{"paths":["A"]},"fooBar",{}]}`, `masks { paths: "A" } masks { paths: "foo_bar" } masks {}`},
		{`{"maskById":{"7":{"paths":["Q_q"]},"-2":"x.yZ"}}`,
			`mask_by_id { key: -2 value { paths: "x.y_z" } } mask_by_id { key: 7 value { paths: "Q_q" } }`},
		{`{"picked":{"paths":["One"]}}`, `picked { paths: "One" }`},
		{`{"mask":"fooBar,baz.quxQuux"}`, `mask { paths: "foo_bar" paths: "baz.qux_quux" }`},
		{`{"n":1,"mask":{"paths":["p"]},"child":{"n":2}}`, `n: 1 mask { paths: "p" } child { n: 2 }`},
	} {
		want := wantMask(t, m, tc.want)
		got, err := m.Encode(nil, []byte(tc.in), EncodeOptions{})
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Encode %s: %x, %v\nwant %x", tc.in, got, err, want)
		}
		slow, err := m.encodeSlow(nil, []byte(tc.in), EncodeOptions{})
		if err != nil || !bytes.Equal(slow, want) {
			t.Errorf("slow path %s: %x, %v\nwant %x", tc.in, slow, err, want)
		}
		// a null beside it: protojson's path for the whole message
		withNull := strings.Replace(tc.in, "{", `{"other":null,`, 1)
		if strings.Contains(tc.in, `"picked"`) {
			withNull = strings.Replace(tc.in, "{", `{"n":null,`, 1)
		}
		fe := fastEncoder{reg: r, in: []byte(withNull)}
		if _, ok := fe.encode(nil, m.plan); ok {
			t.Errorf("%s took the fast path", withNull)
		}
		got, err = m.Encode(nil, []byte(withNull), EncodeOptions{})
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Encode %s: %x, %v\nwant %x", withNull, got, err, want)
		}
	}
	// the message form is read on the fast path
	fe := fastEncoder{reg: r, in: []byte(`{"items":[{"mask":{"paths":["en_GB"]}}]}`)}
	if _, ok := fe.encode(nil, m.plan); !ok {
		t.Error("the message form left the fast path")
	}
	// a Lua table: the direct path leaves it to the JSON text, which reads it
	ser, err := luaserial.FromJSON(nil, []byte(`{"items":[{"mask":{"paths":["en_GB","Num"]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.EncodeLua(nil, ser); ok {
		t.Error("EncodeLua took a FieldMask itself")
	}
	if plain, err := luaserial.FromJSON(nil, []byte(`{"items":[{"n":3}]}`)); err != nil {
		t.Fatal(err)
	} else if _, ok := m.EncodeLua(nil, plain); !ok {
		t.Error("EncodeLua refused a table without a FieldMask: the check above says nothing")
	}
	want := wantMask(t, m, `items { mask { paths: "en_GB" paths: "Num" } }`)
	if got, err := viaJSON(m, ser); err != nil || !bytes.Equal(got, want) {
		t.Errorf("a Lua table: %x, %v, want %x", got, err, want)
	}
	// a FieldMask as the whole request
	fmm := mustMessage(t, r, "google.protobuf.FieldMask")
	got, err := fmm.Encode(nil, []byte(` {"paths":["Num"]} `), EncodeOptions{})
	if want := []byte("\x0a\x03Num"); err != nil || !bytes.Equal(got, want) {
		t.Errorf("a FieldMask request: %x, %v, want %x", got, err, want)
	}
}

// TestFieldMaskMessageFormErrors: other objects for a FieldMask are
// refused, where they are, on both paths.
func TestFieldMaskMessageFormErrors(t *testing.T) {
	r := maskRegistry(t)
	m := mustMessage(t, r, "fm.Holder")
	const what = `expected a string or {"paths": [strings]} (google.protobuf.FieldMask), got object`
	for _, tc := range []struct{ in, want string }{
		{`{"mask":{"paths":"a"}}`, "mask: " + what},
		{`{"mask":{"paths":["a",1]}}`, "mask: " + what},
		{`{"mask":{"paths":[null]}}`, "mask: " + what},
		{`{"mask":{"paths":null}}`, "mask: " + what},
		{`{"mask":{"paths":["a"],"x":1}}`, "mask: " + what},
		{`{"mask":{"paths":["a"],"paths":["b"]}}`, "mask: " + what},
		{`{"mask":{"other":["a"]}}`, "mask: " + what},
		{`{"items":[{"mask":{"paths":[2]}}]}`, "items[0].mask: " + what},
		{"{\"mask\":{\"paths\":[\"\xff\"]}}", "mask: " + what},
		{`{"mask":"a_b"}`, `mask: invalid google.protobuf.FieldMask: google.protobuf.FieldMask.paths contains invalid path: "a_b"`},
		// a good mask beside a bad field: the error is the field's
		{`{"mask":{"paths":["en_GB"]},"n":"x"}`, `n: expected int32, got string "x"`},
	} {
		_, err := m.Encode(nil, []byte(tc.in), EncodeOptions{})
		if err == nil || !strings.HasPrefix(err.Error(), "bad message: fm.Holder: "+tc.want) {
			t.Errorf("%s: %v, want bad message: fm.Holder: %s...", tc.in, err, tc.want)
		}
	}
}

// FuzzFieldMaskForms: on any input, what the fast path accepts the slow
// path (protojson with the message form lifted out) accepts too, with the
// same bytes.
func FuzzFieldMaskForms(f *testing.F) {
	for _, s := range []string{
		`{"mask":{"paths":["en_GB","Num"]}}`, `{"mask":{}}`, `{"masks":[{"paths":["A"]},"fooBar"]}`,
		`{"maskById":{"7":{"paths":["Q_q"]}}}`, `{"items":[{"mask":{"paths":["a"]}}],"n":1}`,
		`{"byName":{"k":{"picked":{"paths":[]}}}}`, `{"mask":{"paths":["a"],"paths":["b"]}}`,
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fm.proto"), []byte(maskProto), 0o644); err != nil {
		f.Fatal(err)
	}
	r := NewRegistry()
	if err := r.LoadFile(filepath.Join(dir, "fm.proto"), nil); err != nil {
		f.Fatal(err)
	}
	m := mustMessage(f, r, "fm.Holder")
	f.Fuzz(func(t *testing.T, js []byte) {
		fe := fastEncoder{reg: r, in: js}
		fast, ok := fe.encode(nil, m.plan)
		slow, err := m.encodeSlow(nil, js, EncodeOptions{})
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("fast path accepted %q, the slow path: %v", js, err)
		}
		if !bytes.Equal(fast, slow) {
			t.Fatalf("%q:\n fast %x\n slow %x", js, fast, slow)
		}
	})
}
