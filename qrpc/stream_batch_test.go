package qrpc_test

import (
	"bytes"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// whereServer answers "where" with the id of the stream the request came
// on, and echoes "echo".
func whereServer(t *testing.T, e *env) string {
	codec := frame.New(0)
	return streamServer(t, e, nil, func(st *quic.Stream, req *qrpcpb.Request) bool {
		b, _ := codec.AppendResponse(nil, &qrpcpb.Response{RequestId: req.RequestId,
			Body: []byte(strconv.FormatInt(int64(st.StreamID()), 10))})
		_, err := st.Write(b)
		return err == nil
	})
}

func where(t *testing.T, c *qrpc.Client, body []byte) string {
	t.Helper()
	res, err := unary(c, 5*time.Second, "where", body)
	if err != nil {
		t.Fatal(err)
	}
	return string(res.Body)
}

// runs splits a sequence of stream ids into runs of the same id.
func runs(ids []string) (lens []int, heads []string) {
	for i, id := range ids {
		if i == 0 || id != ids[i-1] {
			lens = append(lens, 0)
			heads = append(heads, id)
		}
		lens[len(lens)-1]++
	}
	return lens, heads
}

// TestStreamBatch: consecutive calls go to one stream StreamBatch at a
// time and then to the next, over every stream; StreamBatch 1 is a plain
// round robin; big frames (16 KiB or more) take the streams one at a time
// without breaking the run of the small ones.
func TestStreamBatch(t *testing.T) {
	e := newEnv(t)
	addr := whereServer(t, e)

	for _, batch := range []int{1, 5} {
		c := dialAddr(t, e, addr, &qrpc.Config{Streams: 4, StreamBatch: batch})
		var ids []string
		for range 12 * batch {
			ids = append(ids, where(t, c, nil))
		}
		lens, heads := runs(ids)
		// The first and last runs may be cut short by where the counter
		// stood; every run in between is exactly one batch.
		for i := 1; i < len(lens)-1; i++ {
			if lens[i] != batch {
				t.Fatalf("batch %d: runs of one stream %v (streams %v), want %d each", batch, lens, heads, batch)
			}
		}
		seen := map[string]bool{}
		for _, h := range heads {
			seen[h] = true
		}
		if len(seen) != 4 {
			t.Fatalf("batch %d: calls went to %d streams (%v), want all 4", batch, len(seen), heads)
		}
	}

	// Big frames: each on the next stream, while the small calls around
	// them stay on theirs.
	c := dialAddr(t, e, addr, &qrpc.Config{Streams: 4, StreamBatch: 1000})
	big := make([]byte, 16<<10) // random: the codec compresses what it can
	rand.Read(big)
	small := where(t, c, nil)
	bigs := map[string]bool{}
	for range 4 {
		bigs[where(t, c, big)] = true
		if got := where(t, c, nil); got != small {
			t.Fatalf("a small call after a big one went to stream %s, want %s (its batch's)", got, small)
		}
	}
	if len(bigs) != 4 {
		t.Fatalf("4 big frames went to %d streams, want 4", len(bigs))
	}
}

// TestStreamBatchConfig: the default and the bounds.
func TestStreamBatchConfig(t *testing.T) {
	if qrpc.DefaultStreamBatch != 16 {
		t.Fatalf("DefaultStreamBatch %d: docs/api.md says 16", qrpc.DefaultStreamBatch)
	}
	for _, n := range []int{-1, 1025} {
		if _, err := qrpc.Dial(t.Context(), "127.0.0.1:9", &qrpc.Config{StreamBatch: n}); err == nil ||
			!bytes.Contains([]byte(err.Error()), []byte("stream batch must be 1..1024")) {
			t.Fatalf("StreamBatch %d: %v, want the bound", n, err)
		}
	}
}
