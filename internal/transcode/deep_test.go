package transcode

import (
	"bytes"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

// deepProto nests a message in itself every way a request can: a field,
// a list's item, a map's value, a oneof's member, and a Struct; and it
// can hold a FieldMask, which sends the slow path through
// liftFieldMasks.
const deepProto = `syntax = "proto3"; package dp;
import "google/protobuf/field_mask.proto";
import "google/protobuf/struct.proto";
message Node {
  Node next = 1;
  repeated Node items = 2;
  map<string, Node> by_name = 3;
  oneof pick { Node one = 4; string other = 5; }
  google.protobuf.FieldMask mask = 6;
  google.protobuf.Struct st = 7;
  int32 n = 8;
}`

func deepNode(t *testing.T) *Message {
	t.Helper()
	dir := writeFiles(t, map[string]string{"dp.proto": deepProto})
	r := NewRegistry()
	if err := r.LoadFile(filepath.Join(dir, "dp.proto"), nil); err != nil {
		t.Fatal(err)
	}
	return mustMessage(t, r, "dp.Node")
}

// nest is a dp.Node whose JSON nests levels objects and arrays (the
// outermost included), each way of deepProto's, around inner.
var nestings = []struct {
	name        string
	open, close string
	per         int // levels per repetition
}{
	{"field", `{"next":`, `}`, 1},
	{"list", `{"items":[`, `]}`, 2},
	{"map", `{"byName":{"k":`, `}}`, 2},
	{"oneof", `{"one":`, `}`, 1},
	{"Struct", `{"a":`, `}`, 1},
}

func nest(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// TestEncodeNestingLimit: a JSON request nesting 100 objects and arrays
// (the Lua table's limit) is encoded as protojson encodes it; one of 101
// levels, or of 10000, is refused with "nested too deep", without the
// cost of reading it.
func TestEncodeNestingLimit(t *testing.T) {
	m := deepNode(t)
	for _, k := range nestings {
		js := func(levels int) string {
			if k.name == "Struct" { // {"st": then Struct levels
				return `{"st":` + nest(k.open, k.close, levels-2, `{"a":1}`) + `}`
			}
			return nest(k.open, k.close, (levels-1)/k.per, `{"n":1}`)
		}
		ok := js(maxRequestDepth)
		want := dynamicpb.NewMessage(m.desc)
		if err := protojson.Unmarshal([]byte(ok), want); err != nil {
			t.Fatalf("%s: protojson: %v", k.name, err)
		}
		wb, _ := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		got, err := m.Encode(nil, []byte(ok), EncodeOptions{})
		if err != nil || !bytes.Equal(got, wb) {
			t.Errorf("%s, %d levels: %x, %v; want %x", k.name, maxRequestDepth, got, err, wb)
		}
		for _, levels := range []int{maxRequestDepth + 1, 10000} {
			in := []byte(js(levels))
			var ms0, ms1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms0)
			_, err := m.Encode(nil, in, EncodeOptions{})
			runtime.ReadMemStats(&ms1)
			const wantErr = "bad message: dp.Node: nested too deep (more than 100 levels)"
			if err == nil || err.Error() != wantErr {
				t.Errorf("%s, %d levels: %v; want %q", k.name, levels, err, wantErr)
			}
			if a := ms1.TotalAlloc - ms0.TotalAlloc; a > 64<<10 {
				t.Errorf("%s, %d levels (%d bytes): %d bytes allocated to refuse it", k.name, levels, len(in), a)
			}
		}
	}
}

// TestEncodeDeepCostLinear: the slow path of a message that can hold a
// FieldMask reads the text once. It read each nested message's text anew
// (with copies), which cost memory and time quadratic in the depth: a
// 72 KB request nesting 8000 messages took a worker's memory from 1.9 to
// 3.1 GB. Here 99 levels of each nesting around 1 MB of whitespace,
// which protojson reads without allocating.
func TestEncodeDeepCostLinear(t *testing.T) {
	m := deepNode(t)
	pad := `{"n":1` + strings.Repeat(" ", 1<<20) + `}`
	for _, k := range nestings[:4] {
		in := []byte(nest(k.open, k.close, (maxRequestDepth-1)/k.per, pad))
		a, err := encodeAllocs(m, in)
		if err != nil {
			t.Fatalf("%s: %v", k.name, err)
		}
		// protojson and the lifter's output copy: a few times the input
		if a > uint64(8*len(in)) {
			t.Errorf("%s: %d bytes allocated for a %d-byte request", k.name, a, len(in))
		}
	}
}

// TestEncodeDeepErrorCostLinear: finding where a deep request is wrong
// (an unknown field at the 99th level, behind 1 MB of whitespace) walks
// slices of the request, not copies: each level copied the rest of the
// text (a decoder and a raw value per level), half a gigabyte allocated
// to say one field's name.
func TestEncodeDeepErrorCostLinear(t *testing.T) {
	m := deepNode(t)
	pad := `{"nope":1` + strings.Repeat(" ", 1<<20) + `}`
	for _, k := range nestings[:4] {
		in := []byte(nest(k.open, k.close, (maxRequestDepth-1)/k.per, pad))
		a, err := encodeAllocs(m, in)
		if err == nil || !strings.Contains(err.Error(), "nope: unknown field") {
			t.Fatalf("%s: %v", k.name, err)
		}
		if a > uint64(8*len(in)) {
			t.Errorf("%s: %d bytes allocated to refuse a %d-byte request", k.name, a, len(in))
		}
	}
}

// encodeAllocs encodes in with m and says how many bytes that allocated.
func encodeAllocs(m *Message, in []byte) (uint64, error) {
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	_, err := m.Encode(nil, in, EncodeOptions{})
	runtime.ReadMemStats(&ms1)
	return ms1.TotalAlloc - ms0.TotalAlloc, err
}
