package transcode

import (
	"bytes"
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
)

// FuzzDecode feeds arbitrary bytes to the response decoder. It must never
// panic; it must accept exactly what the generated code accepts and give
// the same JSON; and what it gives must encode back to a message that
// decodes to the same JSON.
func FuzzDecode(f *testing.F) {
	for _, m := range []proto.Message{fullAllKinds(), profile(), &demopb.AllKinds{}, &demopb.AllKinds{Choice: &demopb.AllKinds_ChoiceText{}}} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("\xff\xff"))
	f.Add([]byte("\x0a\x80"))
	r := demoRegistry(f)
	m := mustMessage(f, r, "demo.AllKinds")
	f.Fuzz(func(t *testing.T, pb []byte) {
		js, err := m.Decode(nil, pb, DecodeOptions{})

		var gen demopb.AllKinds
		genErr := proto.Unmarshal(pb, &gen)
		var genJSON []byte
		if genErr == nil {
			genJSON, genErr = protojson.Marshal(&gen)
		}
		if (err == nil) != (genErr == nil) {
			t.Fatalf("ours: %v; generated code: %v", err, genErr)
		}
		if err != nil {
			if !bytes.HasPrefix([]byte(err.Error()), []byte("bad response: demo.AllKinds: ")) {
				t.Fatalf("error not shaped: %v", err)
			}
			return
		}
		if !json.Valid(js) {
			t.Fatalf("invalid JSON %q", js)
		}
		genJSON = compactJSON(genJSON)
		if !bytes.Equal(js, genJSON) {
			t.Fatalf("JSON differs:\n ours %s\n gen  %s", js, genJSON)
		}
		// every field outside a oneof, as protojson's EmitUnpopulated
		jsAll, err := m.Decode(nil, pb, DecodeOptions{EmitDefaults: true})
		genAll, genErr := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(&gen)
		if err != nil || genErr != nil || !bytes.Equal(jsAll, compactJSON(genAll)) {
			t.Fatalf("emit: JSON differs (%v, %v):\n ours %s\n gen  %s", err, genErr, jsAll, compactJSON(genAll))
		}
		pb2, err := m.Encode(nil, js, EncodeOptions{})
		if err != nil {
			t.Fatalf("our JSON %s does not encode: %v", js, err)
		}
		js2, err := m.Decode(nil, pb2, DecodeOptions{})
		if err != nil || !bytes.Equal(js, js2) {
			t.Fatalf("second round: %s, %v\nwant %s", js2, err, js)
		}
	})
}
