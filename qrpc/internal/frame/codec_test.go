package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// allocated reports the heap bytes f allocates (cumulative, so it also
// counts what was freed again): the bound a hostile input can force on us.
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func header(l uint32, flag byte) []byte {
	var h [HeaderSize]byte
	binary.BigEndian.PutUint32(h[:], l)
	h[4] = flag
	return h[:]
}

// endless yields zeros forever: a peer that keeps sending.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestLengthPrefixOverLimitRejectedBeforeAllocation(t *testing.T) {
	c := New(0)
	for _, l := range []uint32{DefaultMaxFrameSize + 1, 1 << 30, 0xffffffff} {
		var err error
		n := allocated(func() {
			r := c.NewReader(io.MultiReader(bytes.NewReader(header(l, FlagResponse)), endless{}))
			_, _, err = r.Next()
		})
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("L=%d: err %v, want ErrFrameTooLarge", l, err)
		}
		// The reader's own 32 KiB bufio buffer is all it may allocate.
		if n > 256<<10 {
			t.Fatalf("L=%d: allocated %d bytes before rejecting", l, n)
		}
		if _, _, err := c.ParseFrame(append(header(l, FlagResponse), 0)); !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("ParseFrame L=%d: %v", l, err)
		}
	}
	// The limit itself is allowed.
	small := New(64)
	frame := append(header(64, FlagRequest), make([]byte, 63)...)
	if _, _, err := small.NewReader(bytes.NewReader(frame)).Next(); err != nil {
		t.Fatalf("frame at the limit: %v", err)
	}
	frame = append(header(65, FlagRequest), make([]byte, 64)...)
	if _, _, err := small.NewReader(bytes.NewReader(frame)).Next(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("frame one over the limit: %v", err)
	}
}

// A prefix that promises the maximum but delivers little must not cost the
// maximum: the payload buffer grows with the bytes received.
func TestPromisedButUndeliveredPayloadIsCheap(t *testing.T) {
	c := New(0)
	var err error
	n := allocated(func() {
		r := c.NewReader(io.MultiReader(bytes.NewReader(header(DefaultMaxFrameSize, FlagRequest)), bytes.NewReader(make([]byte, 1000))))
		_, _, err = r.Next()
	})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want unexpected EOF", err)
	}
	if n > 1<<20 {
		t.Fatalf("allocated %d bytes for a 1000-byte partial payload", n)
	}
}

func TestZeroLengthAndUnknownFlag(t *testing.T) {
	c := New(0)
	if _, _, err := c.NewReader(bytes.NewReader(header(0, FlagRequest))).Next(); !errors.Is(err, ErrBadLength) {
		t.Fatalf("zero length: %v", err)
	}
	if _, _, err := c.ParseFrame(header(0, FlagRequest)[:4]); !errors.Is(err, ErrBadLength) {
		t.Fatalf("ParseFrame short: %v", err)
	}
	for _, f := range []byte{0, 7, 8, 0x80, 0xff} {
		fr := append(header(3, f), 0x18, 0x01)
		if _, _, err := c.NewReader(bytes.NewReader(fr)).Next(); !errors.Is(err, ErrUnknownFlag) {
			t.Fatalf("flag %d: %v", f, err)
		}
		if _, _, err := c.ParseFrame(fr); !errors.Is(err, ErrUnknownFlag) {
			t.Fatalf("ParseFrame flag %d: %v", f, err)
		}
	}
	// L=1: a flag and an empty payload is a valid (empty) message.
	k, p, err := c.NewReader(bytes.NewReader(header(1, FlagEvent))).Next()
	if err != nil || k != KindEvent || len(p) != 0 {
		t.Fatalf("L=1: %v %v %d", k, err, len(p))
	}
}

func TestTruncatedAndCleanEnd(t *testing.T) {
	c := New(0)
	good, err := c.AppendRequest(nil, KindRequest, &qrpcpb.Request{RequestId: 5, Method: []byte("m"), Body: []byte("body")})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.NewReader(bytes.NewReader(nil)).Next(); err != io.EOF {
		t.Fatalf("empty stream: %v, want io.EOF", err)
	}
	for cut := 1; cut < len(good); cut++ {
		_, _, err := c.NewReader(bytes.NewReader(good[:cut])).Next()
		if err == nil || err == io.EOF {
			t.Fatalf("cut at %d: %v, want an error other than a clean EOF", cut, err)
		}
	}
	// Many frames back to back, across bufio refills.
	var stream []byte
	const n = 5000
	for i := range n {
		stream, err = c.AppendRequest(stream, KindRequest, &qrpcpb.Request{RequestId: uint64(i + 1), Body: bytes.Repeat([]byte{byte(i)}, i%97)})
		if err != nil {
			t.Fatal(err)
		}
	}
	r := c.NewReader(bytes.NewReader(stream))
	for i := range n {
		k, p, err := r.Next()
		if err != nil || k != KindRequest {
			t.Fatalf("frame %d: %v %v", i, k, err)
		}
		var m qrpcpb.Request
		if err := m.UnmarshalVT(p); err != nil || m.RequestId != uint64(i+1) || len(m.Body) != i%97 {
			t.Fatalf("frame %d: %v id %d len %d", i, err, m.RequestId, len(m.Body))
		}
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}
}

func TestCompressionThreshold(t *testing.T) {
	c := New(0)
	// A request whose marshalled size is exactly want: method (2+1) + body
	// (1 + varint len + n).
	sized := func(want int, fill func([]byte)) *qrpcpb.Request {
		for n := want; n > 0; n-- {
			body := make([]byte, n)
			fill(body)
			m := &qrpcpb.Request{Method: []byte("m"), Body: body}
			if m.SizeVT() == want {
				return m
			}
		}
		t.Fatalf("cannot build a %d-byte message", want)
		return nil
	}
	zeros := func([]byte) {}
	noise := func(b []byte) {
		r := rand.New(rand.NewPCG(1, 2))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
	}
	cases := []struct {
		name     string
		size     int
		fill     func([]byte)
		wantZstd bool
	}{
		{"compressible at threshold stays raw", CompressThreshold, zeros, false},
		{"compressible one over threshold is compressed", CompressThreshold + 1, zeros, true},
		{"compressible large is compressed", 1 << 20, zeros, true},
		{"incompressible over threshold stays raw", CompressThreshold + 1, noise, false},
		{"incompressible large stays raw", 256 << 10, noise, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := sized(tc.size, tc.fill)
			for _, k := range []Kind{KindRequest, KindEvent} {
				b, err := c.AppendRequest([]byte("prefix"), k, m)
				if err != nil {
					t.Fatal(err)
				}
				if string(b[:6]) != "prefix" {
					t.Fatal("AppendRequest clobbered dst")
				}
				b = b[6:]
				plain, zflag := k.flags()
				switch {
				case tc.wantZstd && b[4] != zflag, !tc.wantZstd && b[4] != plain:
					t.Fatalf("kind %d: flag %d, want zstd=%v", k, b[4], tc.wantZstd)
				}
				if tc.wantZstd && len(b)-HeaderSize >= tc.size {
					t.Fatalf("compressed frame not smaller: %d >= %d", len(b)-HeaderSize, tc.size)
				}
				if !tc.wantZstd && len(b) != HeaderSize+tc.size {
					t.Fatalf("raw frame is %d bytes, want %d", len(b), HeaderSize+tc.size)
				}
				gk, p, err := c.ParseFrame(b)
				if err != nil || gk != k {
					t.Fatalf("round trip: %v %v", gk, err)
				}
				var got qrpcpb.Request
				if err := got.UnmarshalVT(p); err != nil || !got.EqualVT(m) {
					t.Fatalf("round trip changed the message: %v", err)
				}
			}
			r := &qrpcpb.Response{RequestId: 1, Body: m.Body}
			b, err := c.AppendResponse(nil, r)
			if err != nil {
				t.Fatal(err)
			}
			if isZ := b[4] == FlagResponseZstd; isZ != (tc.wantZstd && r.SizeVT() > CompressThreshold) {
				t.Fatalf("response flag %d", b[4])
			}
		})
	}
}

func TestEncodeOverLimit(t *testing.T) {
	c := New(1024)
	_, err := c.AppendRequest(nil, KindRequest, &qrpcpb.Request{Body: make([]byte, 1024)})
	if !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("err %v", err)
	}
	// Compressible or not, the limit is on the message, as the peer's decoder
	// bounds the decompressed size by it.
	b, err := c.AppendRequest(nil, KindRequest, &qrpcpb.Request{Body: make([]byte, 1000)})
	if err != nil || len(b) > 1024+HeaderSize {
		t.Fatalf("under the limit: %v", err)
	}
}

// zstd frames built by hand, to say exactly what a hostile peer sends.
type zframe struct {
	fcs       int64 // -1: not declared
	windowLog uint  // 0: single segment (window = fcs)
	blocks    []byte
}

func (z zframe) bytes() []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd}
	var fhd byte
	single := z.windowLog == 0
	if single {
		fhd |= 1 << 5
	}
	var fcs []byte
	if z.fcs >= 0 {
		fhd |= 3 << 6
		fcs = binary.LittleEndian.AppendUint64(nil, uint64(z.fcs))
	}
	b = append(b, fhd)
	if !single {
		b = append(b, byte(z.windowLog-10)<<3)
	}
	b = append(b, fcs...)
	return append(b, z.blocks...)
}

// rleBlocks produces total bytes of 'A' in RLE blocks of at most 128 KiB:
// four bytes of input per 128 KiB of output, the best ratio zstd allows.
func rleBlocks(total int) []byte {
	var b []byte
	for total > 0 {
		n := min(total, maxBlockSize)
		total -= n
		h := uint32(1<<1) | uint32(n)<<3
		if total == 0 {
			h |= 1
		}
		b = append(b, byte(h), byte(h>>8), byte(h>>16), 'A')
	}
	return b
}

// TestZstdBombs: no zstd frame can expand 1 KB into 1 GB (a block yields at
// most 128 KiB, so the best ratio is about 32768:1); the 1 GB bombs are
// therefore a 1 KB frame that declares 1 GB, and a 32 KB frame that really
// expands to 1 GB without declaring it, or while declaring less. Each must
// fail with ErrTooLarge (or ErrBadCompression for a lie) at small cost.
func TestZstdBombs(t *testing.T) {
	const gig = 1 << 30
	cases := []struct {
		name    string
		z       []byte
		want    error
		maxHeap uint64
	}{
		{"1KB declaring 1GB", zframe{fcs: gig, windowLog: 17, blocks: rleBlocks(gig)[:1000]}.bytes(), ErrTooLarge, 1 << 20},
		{"32KB undeclared 1GB", zframe{fcs: -1, windowLog: 17, blocks: rleBlocks(gig)}.bytes(), ErrTooLarge, 4 << 20},
		{"32KB undeclared 1GB 16MB window", zframe{fcs: -1, windowLog: 24, blocks: rleBlocks(gig)}.bytes(), ErrTooLarge, 24 << 20},
		{"32KB declaring 1MB expanding to 1GB", zframe{fcs: 1 << 20, windowLog: 17, blocks: rleBlocks(gig)}.bytes(), ErrBadCompression, 4 << 20},
		{"32KB declaring 16MB expanding to 1GB", zframe{fcs: DefaultMaxFrameSize, windowLog: 17, blocks: rleBlocks(gig)}.bytes(), ErrTooLarge, 24 << 20},
		{"1GB window", zframe{fcs: -1, windowLog: 30, blocks: rleBlocks(10)}.bytes(), ErrTooLarge, 1 << 20},
		{"single segment 1GB", zframe{fcs: gig, blocks: rleBlocks(10)}.bytes(), ErrTooLarge, 1 << 20},
	}
	c := New(0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			frame := append(header(uint32(len(tc.z)+1), FlagResponseZstd), tc.z...)
			var err error
			n := allocated(func() { _, _, err = c.NewReader(bytes.NewReader(frame)).Next() })
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if n > tc.maxHeap {
				t.Fatalf("%d-byte frame made the decoder allocate %d MiB (bound %d MiB)", len(frame), n>>20, tc.maxHeap>>20)
			}
			t.Logf("%d-byte frame: %v; allocated %.1f MiB", len(frame), err, float64(n)/(1<<20))
		})
	}
}

// Well-formed hand-made frames at the limit decode; one byte more does not.
func TestZstdAtLimit(t *testing.T) {
	const limit = 1 << 20
	c := New(limit)
	for _, declared := range []bool{true, false} {
		fcs := int64(-1)
		if declared {
			fcs = limit
		}
		out, err := c.Decompress(nil, zframe{fcs: fcs, windowLog: 17, blocks: rleBlocks(limit)}.bytes())
		if err != nil || len(out) != limit || out[0] != 'A' || out[limit-1] != 'A' {
			t.Fatalf("declared=%v at limit: %d bytes, %v", declared, len(out), err)
		}
		if declared {
			fcs++
		}
		_, err = c.Decompress(nil, zframe{fcs: fcs, windowLog: 17, blocks: rleBlocks(limit + 1)}.bytes())
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("declared=%v over limit: %v", declared, err)
		}
	}
	// klauspost's own streaming encoder writes no content size: a peer using
	// it must still be understood.
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("stream "), 100000)
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var h zstd.Header
	if err := h.Decode(buf.Bytes()); err != nil || h.HasFCS {
		t.Fatalf("expected a frame without content size: %v %v", err, h.HasFCS)
	}
	// Its default window (8 MiB) is over this codec's 1 MiB limit.
	out, err := New(0).Decompress(nil, buf.Bytes())
	if err != nil || !bytes.Equal(out, msg) {
		t.Fatalf("undeclared size: %v", err)
	}
	if _, err := c.Decompress(nil, []byte("not zstd at all")); !errors.Is(err, ErrBadCompression) {
		t.Fatalf("garbage: %v", err)
	}
}

// Steady state: reading and writing small frames allocates nothing.
func TestSteadyStateAllocs(t *testing.T) {
	c := New(0)
	req := &qrpcpb.Request{RequestId: 77, Method: []byte("echo"), Headers: [][]byte{[]byte("k"), []byte("v")}, Body: make([]byte, 100)}
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(1000, func() {
		var err error
		buf, err = c.AppendRequest(buf[:0], KindRequest, req)
		if err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("AppendRequest: %v allocs per frame", n)
	}
	one := append([]byte(nil), buf...)
	src := &repeater{frame: one}
	r := c.NewReader(src)
	if n := testing.AllocsPerRun(1000, func() {
		if _, _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Reader.Next: %v allocs per frame", n)
	}
}

// repeater yields the same frame forever.
type repeater struct {
	frame []byte
	off   int
}

func (r *repeater) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.frame[r.off:])
		n += c
		r.off = (r.off + c) % len(r.frame)
	}
	return n, nil
}

func TestLargeUncompressedFrameThroughReader(t *testing.T) {
	c := New(0)
	r := rand.New(rand.NewPCG(3, 4))
	body := make([]byte, 5<<20)
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	b, err := c.AppendResponse(nil, &qrpcpb.Response{RequestId: 9, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if b[4] != FlagResponse {
		t.Fatalf("random body compressed? flag %d", b[4])
	}
	fr := c.NewReader(iotestHalf{bytes.NewReader(b)})
	_, p, err := fr.Next()
	if err != nil {
		t.Fatal(err)
	}
	var m qrpcpb.Response
	if err := m.UnmarshalVT(p); err != nil || !bytes.Equal(m.Body, body) {
		t.Fatalf("5 MiB frame: %v", err)
	}
	// The big buffer is released before the next frame.
	if _, _, err := fr.Next(); err != io.EOF {
		t.Fatal(err)
	}
	if cap(fr.buf) > 1<<20 {
		t.Fatalf("reader still holds %d bytes", cap(fr.buf))
	}
}

// iotestHalf returns at most 1000 bytes per Read, like a network stream.
type iotestHalf struct{ r io.Reader }

func (h iotestHalf) Read(p []byte) (int, error) { return h.r.Read(p[:min(len(p), 1000)]) }

// Found by FuzzReader: a header followed by nothing came back as a wrapped
// io.EOF, which callers take for a clean end of stream.
func TestHeaderThenEOFIsNotCleanEnd(t *testing.T) {
	c := New(0)
	for _, l := range []uint32{2, 1 << 20} {
		_, _, err := c.NewReader(bytes.NewReader(header(l, FlagRequest))).Next()
		if errors.Is(err, io.EOF) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("L=%d: %v, want io.ErrUnexpectedEOF and not io.EOF", l, err)
		}
	}
}
