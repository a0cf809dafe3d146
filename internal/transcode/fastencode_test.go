package transcode

import (
	"bytes"
	"encoding/base64"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
)

// The fast encoder handles ordinary input itself (no fallback), in any key
// order and with either field name, and writes protojson's bytes.
func TestFastEncodeMatchesProtojson(t *testing.T) {
	r := demoRegistry(t)
	var inputs []struct {
		msg string
		js  []byte
	}
	for _, gen := range []proto.Message{fullAllKinds(), profile(), &demopb.AllKinds{Ratios: []float64{math.NaN(), math.Inf(-1)}, Data: bytes.Repeat([]byte{0xfe}, 300)}} {
		for _, o := range []protojson.MarshalOptions{{}, {UseProtoNames: true}, {Multiline: true}} {
			js, err := o.Marshal(gen)
			if err != nil {
				t.Fatal(err)
			}
			inputs = append(inputs, struct {
				msg string
				js  []byte
			}{string(gen.ProtoReflect().Descriptor().FullName()), js})
		}
	}
	// Keys in reverse order, strings with escapes, a long nested message.
	inputs = append(inputs, struct {
		msg string
		js  []byte
	}{"demo.AllKinds", []byte(`{"maybe":0,"choiceNum":"-1","counts":{"b":"2","a":"1"},"byId":{"9":{},"-9":{"id":"\u00e9\ud83d\ude00\n\"\/"}},"text":"` + string(bytes.Repeat([]byte("x"), 200)) + `","i32":-1}`)})
	for _, in := range inputs {
		m := mustMessage(t, r, in.msg)
		fe := fastEncoder{reg: r, in: in.js}
		fast, ok := fe.encode(nil, m.plan)
		if !ok {
			t.Fatalf("fast path gave up on %s", in.js)
		}
		slow, err := m.encodeSlow(nil, in.js, EncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fast, slow) {
			t.Fatalf("%s:\n fast %x\n slow %x", in.js, fast, slow)
		}
	}
}

// FuzzEncode: whatever JSON the fast encoder accepts, protojson accepts too
// and encodes to the same bytes; the fast encoder never panics.
func FuzzEncode(f *testing.F) {
	for _, gen := range []proto.Message{fullAllKinds(), profile()} {
		js, err := protojson.Marshal(gen)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(js, false)
	}
	for _, s := range []string{
		`{"i32":1,"i32":2}`, `{"choiceText":"a","choiceNum":"1"}`, `{"tags":["a",null]}`, `{"counts":{"a":"1","a":"2"}}`,
		`{"took":"-0.5s","at":"1970-01-01T00:00:00.000000001Z"}`, `{"nope":{"x":[1,{"y":null}]},"fl":1e38}`,
		`{"data":"_-8","blobs":{"true":"AQ"}}`, `{"color":"COLOR_RED","colors":[1,"COLOR_BLUE"]}`,
		`{"items":[{"child":{"child":{"values":[1,2,3]}}}]}`, `{"wrapped":"0","value":{"a":[1]},"meta":{}}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	r := demoRegistry(f)
	m := mustMessage(f, r, "demo.AllKinds")
	f.Fuzz(func(t *testing.T, js []byte, discard bool) {
		fe := fastEncoder{reg: r, in: js, discard: discard}
		fast, ok := fe.encode(nil, m.plan)
		slow, err := m.encodeSlow(nil, js, EncodeOptions{DiscardUnknown: discard})
		if !ok {
			return // protojson decides
		}
		if err != nil {
			t.Fatalf("fast path accepted %q, protojson: %v", js, err)
		}
		if !bytes.Equal(fast, slow) {
			t.Fatalf("%q:\n fast %x\n slow %x", js, fast, slow)
		}
	})
}

// TestEncodeBase64Forms: a bytes field written in each of the four base64
// forms protojson reads (standard or URL alphabet, padded or not) comes
// out of the fast path as protojson writes it, for every length up to 40
// and bytes that put '+', '/', '-' and '_' in the text.
func TestEncodeBase64Forms(t *testing.T) {
	r := demoRegistry(t)
	m := mustMessage(t, r, "demo.AllKinds")
	encs := []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding}
	for n := 0; n <= 40; n++ {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(0xf8 + i*7) // 0xf8..0xff and onwards: '+'/'/' or '-'/'_' in most groups
		}
		for _, enc := range encs {
			js := []byte(`{"data":"` + enc.EncodeToString(data) + `"}`)
			fe := fastEncoder{reg: r, in: js}
			fast, ok := fe.encode(nil, m.plan)
			if !ok {
				t.Fatalf("%s: fast path refused it", js)
			}
			slow, err := m.encodeSlow(nil, js, EncodeOptions{})
			if err != nil {
				t.Fatalf("%s: protojson: %v", js, err)
			}
			if !bytes.Equal(fast, slow) {
				t.Fatalf("%s:\n fast %x\n slow %x", js, fast, slow)
			}
		}
	}
	// a text mixing the two alphabets is refused by both
	js := []byte(`{"data":"+_AA"}`)
	fe := fastEncoder{reg: r, in: js}
	if _, ok := fe.encode(nil, m.plan); ok {
		t.Fatalf("%s: fast path accepted it", js)
	}
}
