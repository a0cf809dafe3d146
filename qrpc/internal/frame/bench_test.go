package frame

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// benchBodies: 100 B, 4 KiB (both raw), 64 KiB compressible (zstd path) and
// 64 KiB random (over the threshold, tried, sent raw).
func benchBodies() []struct {
	name string
	body []byte
} {
	r := rand.New(rand.NewPCG(5, 6))
	random := make([]byte, 64<<10)
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	text := bytes.Repeat([]byte("qrpc benchmark body "), 4000)
	return []struct {
		name string
		body []byte
	}{
		{"100B", text[:100]},
		{"4KB", text[:4<<10]},
		{"64KB-zstd", text[:64<<10]},
		{"64KB-random", random},
	}
}

func BenchmarkEncode(b *testing.B) {
	c := New(0)
	for _, bb := range benchBodies() {
		req := &qrpcpb.Request{RequestId: 1234567, Method: []byte("echo"), Headers: [][]byte{[]byte("x-id"), []byte("7")}, Body: bb.body}
		b.Run(bb.name, func(b *testing.B) {
			buf := make([]byte, 0, 128<<10)
			b.ReportAllocs()
			b.SetBytes(int64(len(bb.body)))
			for b.Loop() {
				var err error
				buf, err = c.AppendRequest(buf[:0], KindRequest, req)
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(buf)), "wire-bytes")
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	c := New(0)
	for _, bb := range benchBodies() {
		f, err := c.AppendResponse(nil, &qrpcpb.Response{RequestId: 1234567, Method: []byte("echo"), Headers: [][]byte{[]byte("x-id"), []byte("7")}, Body: bb.body})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bb.name, func(b *testing.B) {
			r := c.NewReader(&repeater{frame: f})
			var m qrpcpb.Response
			b.ReportAllocs()
			b.SetBytes(int64(len(bb.body)))
			for b.Loop() {
				_, p, err := r.Next()
				if err != nil {
					b.Fatal(err)
				}
				m = qrpcpb.Response{Headers: m.Headers[:0]}
				if err := m.UnmarshalVTUnsafe(p); err != nil {
					b.Fatal(err)
				}
			}
			if len(m.Body) != len(bb.body) {
				b.Fatal(fmt.Sprint("decoded ", len(m.Body), " bytes"))
			}
		})
	}
}
