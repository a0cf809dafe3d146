package frame

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// vector is one entry of testdata/qrpc-vectors.json, a copy of
// ../shared/qrpc-vectors.json (frames produced by the reference server).
type vector struct {
	Name      string   `json:"name"`
	Kind      string   `json:"kind"`
	RequestID uint64   `json:"request_id"`
	Code      uint32   `json:"code"`
	Method    string   `json:"method"`
	Headers   []string `json:"headers"`
	BodyHex   string   `json:"body_hex"`
	BodyGen   string   `json:"body_gen"`
	Flag      byte     `json:"flag"`
	FrameHex  string   `json:"frame_hex"`
}

func loadVectors(t testing.TB) []vector {
	t.Helper()
	b, err := os.ReadFile("testdata/qrpc-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatalf("parse vectors: %v", err)
	}
	if len(vs) == 0 {
		t.Fatal("no vectors")
	}
	return vs
}

// genBody implements the body_gen mini-language of the vectors file:
// "repeat:S:N" is S repeated N times; "xorshift32:SEED:N" is N bytes, each
// the low byte of x after one xorshift32 step, starting from x = SEED.
func genBody(spec string) ([]byte, error) {
	i := strings.IndexByte(spec, ':')
	j := strings.LastIndexByte(spec, ':')
	if i < 0 || j <= i {
		return nil, fmt.Errorf("body_gen %q: want KIND:ARG:N", spec)
	}
	kind, arg, ns := spec[:i], spec[i+1:j], spec[j+1:]
	n, err := strconv.Atoi(ns)
	if err != nil || n < 0 {
		return nil, fmt.Errorf("body_gen %q: bad count", spec)
	}
	switch kind {
	case "repeat":
		return bytes.Repeat([]byte(arg), n), nil
	case "xorshift32":
		seed, err := strconv.ParseUint(arg, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("body_gen %q: bad seed: %v", spec, err)
		}
		x := uint32(seed)
		out := make([]byte, n)
		for k := range out {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			out[k] = byte(x)
		}
		return out, nil
	}
	return nil, fmt.Errorf("body_gen %q: unknown kind %q", spec, kind)
}

func TestGenBody(t *testing.T) {
	b, err := genBody("repeat:ab:3")
	if err != nil || string(b) != "ababab" {
		t.Fatalf("repeat: %q %v", b, err)
	}
	// Marsaglia's xorshift32 from 2463534242: first state 723471715 (0x2b1f4d63).
	b, err = genBody("xorshift32:2463534242:2")
	if err != nil || len(b) != 2 || b[0] != 0x63 {
		t.Fatalf("xorshift32: %x %v", b, err)
	}
	for _, bad := range []string{"", "repeat", "repeat:x", "repeat:x:-1", "xorshift32:z:3", "nope:a:1"} {
		if _, err := genBody(bad); err == nil {
			t.Errorf("genBody(%q): no error", bad)
		}
	}
}

func (v vector) body(t *testing.T) []byte {
	t.Helper()
	if v.BodyGen != "" {
		b, err := genBody(v.BodyGen)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b, err := hex.DecodeString(v.BodyHex)
	if err != nil {
		t.Fatalf("body_hex: %v", err)
	}
	return b
}

func (v vector) headers() [][]byte {
	var hs [][]byte
	for _, h := range v.Headers {
		hs = append(hs, []byte(h))
	}
	return hs
}

func (v vector) kind(t *testing.T) Kind {
	switch v.Kind {
	case "request":
		return KindRequest
	case "response":
		return KindResponse
	case "event":
		return KindEvent
	}
	t.Fatalf("unknown kind %q", v.Kind)
	return 0
}

// TestVectors checks wire compatibility with the reference implementation:
// every frame decodes to the listed fields, and every uncompressed frame we
// encode is byte-identical to the reference's.
func TestVectors(t *testing.T) {
	c := New(0)
	seenCompressed := false
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			want, err := hex.DecodeString(v.FrameHex)
			if err != nil {
				t.Fatal(err)
			}
			body := v.body(t)
			kind := v.kind(t)
			if want[4] != v.Flag {
				t.Fatalf("vector's flag field %d disagrees with its frame %d", v.Flag, want[4])
			}
			_, compressed, err := Decode(v.Flag)
			if err != nil {
				t.Fatal(err)
			}
			if compressed {
				seenCompressed = true
			}

			// Decode, twice: from the whole frame and through the stream Reader.
			gotKind, payload, err := c.ParseFrame(want)
			if err != nil {
				t.Fatalf("ParseFrame: %v", err)
			}
			checkDecoded(t, v, kind, body, gotKind, payload)
			rk, rp, err := c.NewReader(bytes.NewReader(want)).Next()
			if err != nil {
				t.Fatalf("Reader.Next: %v", err)
			}
			checkDecoded(t, v, kind, body, rk, rp)

			// Encode.
			var enc []byte
			if kind == KindResponse {
				enc, err = c.AppendResponse(nil, &qrpcpb.Response{
					RequestId: v.RequestID, Code: v.Code, Method: []byte(v.Method), Headers: v.headers(), Body: body,
				})
			} else {
				enc, err = c.AppendRequest(nil, kind, &qrpcpb.Request{
					RequestId: v.RequestID, Method: []byte(v.Method), Headers: v.headers(), Body: body,
				})
			}
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if enc[4] != v.Flag {
				t.Fatalf("encoded flag %d, reference %d", enc[4], v.Flag)
			}
			if !compressed {
				if !bytes.Equal(enc, want) {
					t.Fatalf("encoded frame differs from reference\n got %x\nwant %x", enc, want)
				}
				return
			}
			// zstd bytes may differ between encoders; the message may not.
			k2, p2, err := c.ParseFrame(enc)
			if err != nil {
				t.Fatalf("our zstd frame does not decode: %v", err)
			}
			checkDecoded(t, v, kind, body, k2, p2)
		})
	}
	if !seenCompressed {
		t.Fatal("vectors hold no zstd frame; the test would not cover decompression")
	}
}

func checkDecoded(t *testing.T, v vector, kind Kind, body []byte, gotKind Kind, payload []byte) {
	t.Helper()
	if gotKind != kind {
		t.Fatalf("kind %d, want %d", gotKind, kind)
	}
	var (
		id      uint64
		code    uint32
		method  []byte
		headers [][]byte
		gbody   []byte
	)
	if kind == KindResponse {
		var m qrpcpb.Response
		if err := m.UnmarshalVT(payload); err != nil {
			t.Fatalf("unmarshal response: %v", err)
		}
		id, code, method, headers, gbody = m.RequestId, m.Code, m.Method, m.Headers, m.Body
	} else {
		var m qrpcpb.Request
		if err := m.UnmarshalVT(payload); err != nil {
			t.Fatalf("unmarshal request: %v", err)
		}
		id, method, headers, gbody = m.RequestId, m.Method, m.Headers, m.Body
	}
	if id != v.RequestID {
		t.Errorf("request_id %d, want %d", id, v.RequestID)
	}
	if code != v.Code {
		t.Errorf("code %d, want %d", code, v.Code)
	}
	if string(method) != v.Method {
		t.Errorf("method %q, want %q", method, v.Method)
	}
	if len(headers) != len(v.Headers) {
		t.Errorf("headers %q, want %q", headers, v.Headers)
	} else {
		for i := range headers {
			if string(headers[i]) != v.Headers[i] {
				t.Errorf("header %d %q, want %q", i, headers[i], v.Headers[i])
			}
		}
	}
	if !bytes.Equal(gbody, body) {
		t.Errorf("body: %d bytes, want %d (equal prefix: %v)", len(gbody), len(body),
			bytes.HasPrefix(gbody, body[:min(len(body), 16)]))
	}
}
