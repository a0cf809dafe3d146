package frame

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// fuzzLimit keeps each fuzz iteration cheap while still exercising every
// limit check (the checks do not depend on the value).
const fuzzLimit = 1 << 20

// seedFrames are the committed seeds: every reference frame, then hostile
// ones. TestFuzzCorpusUpToDate keeps testdata/fuzz in step with it.
func seedFrames(t testing.TB) map[string][]byte {
	seeds := map[string][]byte{}
	var all []byte
	for _, v := range loadVectors(t) {
		b, err := hex.DecodeString(v.FrameHex)
		if err != nil {
			t.Fatal(err)
		}
		seeds["vector_"+v.Name] = b
		all = append(all, b...)
	}
	seeds["vectors_concatenated"] = all
	zf := func(flag byte, z []byte) []byte { return append(header(uint32(len(z)+1), flag), z...) }
	seeds["hostile_oversized_prefix"] = append(header(0xffffffff, FlagResponse), 1, 2, 3)
	seeds["hostile_prefix_at_limit_then_eof"] = append(header(fuzzLimit, FlagResponse), 1, 2, 3)
	seeds["hostile_zero_length"] = header(0, FlagRequest)
	seeds["hostile_unknown_flag"] = append(header(3, 9), 0x18, 0x01)
	seeds["hostile_garbage_protobuf"] = append(header(9, FlagResponse), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	seeds["hostile_truncated_header"] = []byte{0, 0, 0}
	seeds["hostile_zstd_declares_1gb"] = zf(FlagResponseZstd, zframe{fcs: 1 << 30, windowLog: 17, blocks: rleBlocks(4 * maxBlockSize)}.bytes())
	seeds["hostile_zstd_undeclared_bomb"] = zf(FlagResponseZstd, zframe{fcs: -1, windowLog: 17, blocks: rleBlocks(fuzzLimit + 1)}.bytes())
	seeds["hostile_zstd_lying_size"] = zf(FlagEventZstd, zframe{fcs: 1000, windowLog: 17, blocks: rleBlocks(3 * maxBlockSize)}.bytes())
	seeds["hostile_zstd_huge_window"] = zf(FlagRequestZstd, zframe{fcs: -1, windowLog: 30, blocks: rleBlocks(10)}.bytes())
	seeds["hostile_zstd_not_zstd"] = zf(FlagRequestZstd, []byte("definitely not zstd"))
	seeds["hostile_zstd_empty"] = zf(FlagResponseZstd, nil)
	return seeds
}

// FuzzReader feeds arbitrary bytes to the stream decoder as if a peer sent
// them: it must never panic, never return a payload over the limit, and
// whatever it accepts must survive a re-encode unchanged.
func FuzzReader(f *testing.F) {
	for _, b := range seedFrames(f) {
		f.Add(b)
	}
	c := New(fuzzLimit)
	f.Fuzz(func(t *testing.T, data []byte) {
		r := c.NewReader(bytes.NewReader(data))
		for i := 0; i < 64; i++ {
			kind, payload, err := r.Next()
			if err != nil {
				if err == io.EOF {
					return
				}
				if !knownError(err) {
					t.Fatalf("unclassified error: %v", err)
				}
				return
			}
			if len(payload) > fuzzLimit {
				t.Fatalf("payload of %d bytes passed a %d limit", len(payload), fuzzLimit)
			}
			checkMessage(t, c, kind, payload)
		}
	})
}

// FuzzParseFrame checks the whole-frame parser against the stream reader.
func FuzzParseFrame(f *testing.F) {
	for _, b := range seedFrames(f) {
		f.Add(b)
	}
	c := New(fuzzLimit)
	f.Fuzz(func(t *testing.T, data []byte) {
		kind, payload, err := c.ParseFrame(data)
		if err != nil {
			if !knownError(err) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		rk, rp, rerr := c.NewReader(bytes.NewReader(data)).Next()
		if rerr != nil || rk != kind || !bytes.Equal(rp, payload) {
			t.Fatalf("ParseFrame accepted (kind %d, %d bytes) what Reader did not: kind %d, %d bytes, %v", kind, len(payload), rk, len(rp), rerr)
		}
		checkMessage(t, c, kind, payload)
	})
}

func knownError(err error) bool {
	for _, e := range []error{ErrFrameTooLarge, ErrBadLength, ErrUnknownFlag, ErrTooLarge, ErrBadCompression, io.ErrUnexpectedEOF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// checkMessage: a payload that unmarshals re-encodes to a frame that decodes
// to an equal message, both with the copying and the aliasing unmarshaller.
func checkMessage(t *testing.T, c *Codec, kind Kind, payload []byte) {
	if kind == KindResponse {
		var m, u qrpcpb.Response
		err := m.UnmarshalVT(payload)
		if uerr := u.UnmarshalVTUnsafe(payload); (err == nil) != (uerr == nil) {
			t.Fatalf("UnmarshalVT %v but UnmarshalVTUnsafe %v", err, uerr)
		}
		if err != nil {
			return
		}
		if !m.EqualVT(&u) {
			t.Fatal("safe and unsafe unmarshal disagree")
		}
		b, err := c.AppendResponse(nil, &m)
		if err != nil {
			if errors.Is(err, ErrMessageTooLarge) {
				// A decompressed payload may be the limit itself, one
				// byte more than an encodable message (L counts the flag).
				return
			}
			t.Fatal(err)
		}
		k, p, err := c.ParseFrame(b)
		var back qrpcpb.Response
		if err != nil || k != kind || back.UnmarshalVT(p) != nil || !back.EqualVT(&m) {
			t.Fatalf("response did not survive a re-encode: %v", err)
		}
		return
	}
	var m, u qrpcpb.Request
	err := m.UnmarshalVT(payload)
	if uerr := u.UnmarshalVTUnsafe(payload); (err == nil) != (uerr == nil) {
		t.Fatalf("UnmarshalVT %v but UnmarshalVTUnsafe %v", err, uerr)
	}
	if err != nil {
		return
	}
	if !m.EqualVT(&u) {
		t.Fatal("safe and unsafe unmarshal disagree")
	}
	b, err := c.AppendRequest(nil, kind, &m)
	if err != nil {
		if errors.Is(err, ErrMessageTooLarge) {
			return // as above
		}
		t.Fatal(err)
	}
	k, p, err := c.ParseFrame(b)
	var back qrpcpb.Request
	if err != nil || k != kind || back.UnmarshalVT(p) != nil || !back.EqualVT(&m) {
		t.Fatalf("request did not survive a re-encode: %v", err)
	}
}

// TestFuzzCorpusUpToDate checks that testdata/fuzz holds every seed of
// seedFrames (so `go test` runs them even without -fuzz, and the fuzzer
// starts from them). QRPC_WRITE_CORPUS=1 rewrites the files.
func TestFuzzCorpusUpToDate(t *testing.T) {
	write := os.Getenv("QRPC_WRITE_CORPUS") == "1"
	for name, b := range seedFrames(t) {
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(b)))
		for _, target := range []string{"FuzzReader", "FuzzParseFrame"} {
			path := filepath.Join("testdata", "fuzz", target, name)
			if write {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != want {
				t.Errorf("%s missing or stale (run QRPC_WRITE_CORPUS=1 go test -run TestFuzzCorpusUpToDate): %v", path, err)
			}
		}
	}
}
