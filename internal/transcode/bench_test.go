package transcode

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
)

// profile is the ten-field message of the benchmarks (and of make bench).
func profile() *demopb.Profile {
	return &demopb.Profile{
		Id: 1234567890123, Name: "Ada Lovelace", Email: "ada@example.com", Age: 36, Active: true,
		Score: 98.25, Tags: []string{"math", "engines", "poetry"}, Color: demopb.Color_COLOR_GREEN,
		Avatar:  []byte("\x89PNG\r\n\x1a\n0123456789abcdef"),
		Created: timestamppb.New(time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)),
	}
}

func benchInputs(b *testing.B) (*Message, []byte, []byte) {
	r := demoRegistry(b)
	m := mustMessage(b, r, "demo.Profile")
	js, err := protojson.Marshal(profile())
	if err != nil {
		b.Fatal(err)
	}
	pb, err := proto.Marshal(profile())
	if err != nil {
		b.Fatal(err)
	}
	return m, js, pb
}

// JSON -> protobuf for a request: the cost transcoding adds to a call.
func BenchmarkEncodeProfile(b *testing.B) {
	m, js, _ := benchInputs(b)
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	b.SetBytes(int64(len(js)))
	defer cpuPerOp(b)()
	for b.Loop() {
		var err error
		if buf, err = m.Encode(buf[:0], js, EncodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// The same with the type looked up by name on every call.
func BenchmarkEncodeProfileByName(b *testing.B) {
	_, js, _ := benchInputs(b)
	r := demoRegistry(b)
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		var err error
		if buf, err = r.Encode("demo.Profile", buf[:0], js, EncodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// protobuf -> JSON for a response.
func BenchmarkDecodeProfile(b *testing.B) {
	m, _, pb := benchInputs(b)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	b.SetBytes(int64(len(pb)))
	defer cpuPerOp(b)()
	for b.Loop() {
		var err error
		if buf, err = m.Decode(buf[:0], pb, DecodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// For scale: the generated code doing the same work (protojson + proto on
// a compiled-in type), i.e. what a Go service would pay.
func BenchmarkGeneratedEncodeProfile(b *testing.B) {
	_, js, _ := benchInputs(b)
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		var p demopb.Profile
		if err := protojson.Unmarshal(js, &p); err != nil {
			b.Fatal(err)
		}
		if _, err := proto.Marshal(&p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGeneratedDecodeProfile(b *testing.B) {
	_, _, pb := benchInputs(b)
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		var p demopb.Profile
		if err := proto.Unmarshal(pb, &p); err != nil {
			b.Fatal(err)
		}
		if _, err := protojson.Marshal(&p); err != nil {
			b.Fatal(err)
		}
	}
}

// cpuPerOp reports the process's CPU time per operation ("cpu-ns/op")
// beside the wall time: on a machine shared with other jobs the wall time
// mostly measures the wait for a CPU. Run with -cpu 1 so that the process
// does little else than the loop (its GC included, which the call pays).
func cpuPerOp(b *testing.B) func() {
	start := cpuTime()
	return func() {
		b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
	}
}

func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// The protojson + dynamicpb path the fast paths fall back to, for scale.
func BenchmarkEncodeProfileProtojson(b *testing.B) {
	m, js, _ := benchInputs(b)
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		var err error
		if buf, err = m.encodeSlow(buf[:0], js, EncodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeProfileProtojson(b *testing.B) {
	m, _, pb := benchInputs(b)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		var err error
		if buf, err = m.decodeSlow(buf[:0], pb, DecodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// shuffledProfileJSON is the benchmark message with its keys in the order
// a Lua table's pairs() gives (hash order, never field order), as the
// Lua module sends it: the encoder must put the fields back in order.
func shuffledProfileJSON(b *testing.B, js []byte) []byte {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(js, &obj); err != nil {
		b.Fatal(err)
	}
	order := []string{"tags", "created", "email", "id", "score", "avatar", "name", "color", "active", "age"}
	out := []byte{'{'}
	for i, k := range order {
		v, ok := obj[k]
		if !ok {
			b.Fatalf("profile has no %q", k)
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, k...)
		out = append(out, '"', ':')
		out = append(out, v...)
	}
	return append(out, '}')
}

// Keys in Lua's order: what a call with a Lua table costs.
func BenchmarkEncodeProfileShuffled(b *testing.B) {
	m, js, _ := benchInputs(b)
	js = shuffledProfileJSON(b, js)
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		var err error
		if buf, err = m.Encode(buf[:0], js, EncodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// evict walks a buffer larger than the last-level cache, as an nginx
// worker does between two calls (Lua, nginx, the network stack), so that
// the call after it runs with cold caches. The walk itself is outside the
// timer: ns/op is the cold call alone (cpu-ns/op would count the walk).
var evictBuf = make([]byte, 32<<20)

func evict() {
	for i := 0; i < len(evictBuf); i += 64 {
		evictBuf[i]++
	}
}

func BenchmarkEncodeProfileShuffledCold(b *testing.B) {
	m, js, _ := benchInputs(b)
	js = shuffledProfileJSON(b, js)
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		evict()
		b.StartTimer()
		var err error
		if buf, err = m.Encode(buf[:0], js, EncodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeProfileCold(b *testing.B) {
	m, _, pb := benchInputs(b)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		evict()
		b.StartTimer()
		var err error
		if buf, err = m.Decode(buf[:0], pb, DecodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
