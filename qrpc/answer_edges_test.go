package qrpc_test

import (
	"errors"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// TestHeaderCountNotBypassedByTrailingGarbage: the answer-header limit
// is counted before unmarshalling, before anything is allocated
// (docs/tuning.md). An answer of 4M empty header entries followed by one
// truncated field must be refused as cheaply as the same frame without
// it: a count that gave up at the bad field would let the unmarshal build
// the whole 4M-entry slice (~100 MB, plus its growth copies) first.
func TestHeaderCountNotBypassedByTrailingGarbage(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	const entries = 4 << 20 // 8 MiB of payload, under the 16 MiB frame limit
	build := func(trailing bool) func(id uint64) []byte {
		return func(id uint64) []byte {
			p := protowire.AppendTag(nil, 3, protowire.VarintType)
			p = protowire.AppendVarint(p, id)
			for range entries {
				p = append(p, 0x0a, 0x00) // field 1, bytes, empty
			}
			if trailing {
				// field 4 (body), bytes, length 5, but no data follows
				p = append(p, 0x22, 0x05)
			}
			return append(hdr(uint32(len(p)+1), frame.FlagResponse), p...)
		}
	}
	for _, trailing := range []bool{false, true} {
		mk := build(trailing)
		addr := rawServer(t, e, func(c *quic.Conn) {
			answerEach(c, func(req *qrpcpb.Request) []byte { return mk(req.RequestId) })
		})
		c := dialAt(t, e, addr, &qrpc.Config{Streams: 1, BackoffBase: 10 * time.Second})
		var err error
		alloc := allocatedDuring(func() { _, err = unary(c, 10*time.Second, "echo", nil) })
		if !errors.Is(err, qrpc.ErrProtocol) {
			t.Fatalf("trailing=%v: %v, want a protocol error", trailing, err)
		}
		t.Logf("trailing=%v: %v; %d MiB allocated (server's frame included)", trailing, err, alloc>>20)
		// Refused by the count (no trailing field), the whole exchange
		// allocates about 75 MiB here (server's frame built by append,
		// quic-go's buffers, the client's grown frame buffer); the 4M-entry
		// [][]byte slice alone is 96 MiB plus its growth copies (measured:
		// 660 MiB in all with the trailing field).
		if alloc > 200<<20 {
			t.Errorf("trailing=%v: %d MiB allocated while refusing an answer of %d header entries: the count was skipped and the unmarshal built them", trailing, alloc>>20, entries)
		}
	}
}

// slowBigServer answers "big" with a well-formed response of size bytes
// written in 256 KiB chunks every pace, and anything else with an echo at
// once; requests on one stream are answered in order.
func slowBigServer(t *testing.T, e *env, size int, pace time.Duration) string {
	return rawServer(t, e, func(c *quic.Conn) {
		codec := frame.New(0)
		answerStream := func(st *quic.Stream) {
			r := codec.NewReader(st)
			for {
				_, p, err := r.Next()
				if err != nil {
					return
				}
				var req qrpcpb.Request
				if err := req.UnmarshalVT(p); err != nil {
					return
				}
				if string(req.Method) != "big" {
					b, _ := codec.AppendResponse(nil, &qrpcpb.Response{RequestId: req.RequestId, Body: req.Body})
					if _, err := st.Write(b); err != nil {
						return
					}
					continue
				}
				pl, _ := (&qrpcpb.Response{RequestId: req.RequestId, Body: make([]byte, size)}).MarshalVT()
				b := append(hdr(uint32(len(pl)+1), frame.FlagResponse), pl...)
				for len(b) > 0 {
					n := min(len(b), 256<<10)
					if _, err := st.Write(b[:n]); err != nil {
						return
					}
					b = b[n:]
					select {
					case <-time.After(pace):
					case <-c.Context().Done():
						return
					}
				}
			}
		}
		for {
			st, err := c.AcceptStream(c.Context())
			if err != nil {
				return
			}
			go answerStream(st)
		}
	})
}

// TestNextCallAfterLargeAnswerTimedOut: an ordinary server, one stream
// (Config.Streams 1). A call whose 10 MB answer is still arriving times
// out; the caller at once makes a small call, which must be answered (it
// waits behind the answer on the same stream). Giving up the last stream
// in service for the partial answer would fail it at once with
// "unavailable: no stream in service" while its replacement opens.
func TestNextCallAfterLargeAnswerTimedOut(t *testing.T) {
	checkGoroutines(t)
	e := newEnv(t)
	addr := slowBigServer(t, e, 10<<20, 20*time.Millisecond) // ~0.8 s for the answer
	c := dialAt(t, e, addr, &qrpc.Config{Streams: 1})
	for i := range 5 {
		if _, err := unary(c, 300*time.Millisecond, "big", nil); !errors.Is(err, qrpc.ErrTimeout) {
			t.Fatalf("round %d: big: %v, want a timeout", i, err)
		}
		resp, err := unary(c, 5*time.Second, "echo", []byte("next"))
		if err != nil || string(resp.Body) != "next" {
			t.Errorf("round %d: the call right after a timed-out large answer: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
