// Package frame encodes and decodes qrpc frames:
//
//	[4 bytes big-endian L][1 byte flag][L-1 bytes payload]
//
// The payload is a protobuf Request or Response, zstd-compressed (one zstd
// frame) under the _ZSTD flags. Decoding never trusts the peer: the length
// prefix is checked before anything is allocated, and zstd output is capped.
package frame

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/qrpcpb"
)

// Flags, as the reference implementation numbers them.
const (
	FlagRequest      byte = 1
	FlagResponse     byte = 2
	FlagEvent        byte = 3
	FlagRequestZstd  byte = 4
	FlagResponseZstd byte = 5
	FlagEventZstd    byte = 6
)

const (
	// HeaderSize is the length prefix plus the flag byte.
	HeaderSize = 5
	// CompressThreshold: payloads larger than this are zstd-compressed when
	// that makes them smaller (the reference uses the same threshold).
	CompressThreshold = 16384
	// DefaultMaxFrameSize bounds L and the decompressed payload.
	DefaultMaxFrameSize = 16 << 20
)

// Errors returned by the decoder. They are wrapped with details; match with
// errors.Is.
var (
	ErrFrameTooLarge = errors.New("frame too large")
	ErrBadLength     = errors.New("bad frame length")
	// ErrAbandoned: Reader.Abandon said nobody waits for the frame being
	// read.
	ErrAbandoned       = errors.New("frame abandoned: nobody waits for it")
	ErrUnknownFlag     = errors.New("unknown frame flag")
	ErrTooLarge        = errors.New("decompressed payload too large")
	ErrBadCompression  = errors.New("bad zstd payload")
	ErrMessageTooLarge = errors.New("message too large")
)

// Kind says which message a flag carries.
type Kind uint8

const (
	KindRequest Kind = iota + 1
	KindResponse
	KindEvent
)

func (k Kind) flags() (plain, compressed byte) {
	switch k {
	case KindRequest:
		return FlagRequest, FlagRequestZstd
	case KindResponse:
		return FlagResponse, FlagResponseZstd
	default:
		return FlagEvent, FlagEventZstd
	}
}

// Decode splits a flag into its kind and whether the payload is compressed.
func Decode(flag byte) (k Kind, compressed bool, err error) {
	switch flag {
	case FlagRequest, FlagResponse, FlagEvent:
		return Kind(flag), false, nil
	case FlagRequestZstd, FlagResponseZstd, FlagEventZstd:
		return Kind(flag - 3), true, nil
	}
	return 0, false, fmt.Errorf("%w: %d", ErrUnknownFlag, flag)
}

// Codec holds the limits and the zstd state shared by the encoders and
// decoders of one client or server. The zero value is not usable; call New.
type Codec struct {
	maxFrame int
	window   int       // the largest zstd window accepted
	encoders sync.Pool // *zstd.Encoder
	decoders sync.Pool // *zstd.Decoder
	bufs     sync.Pool // *[]byte
}

// New returns a codec that refuses frames (and decompressed payloads) larger
// than maxFrame bytes; maxFrame <= 0 means DefaultMaxFrameSize.
func New(maxFrame int) *Codec {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrameSize
	}
	if maxFrame > 1<<31-1 {
		maxFrame = 1<<31 - 1
	}
	c := &Codec{maxFrame: maxFrame}
	c.encoders.New = func() any {
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))
		if err != nil {
			return err
		}
		return enc
	}
	window := maxFrame
	if window < zstd.MinWindowSize {
		window = zstd.MinWindowSize
	}
	if window > zstd.MaxWindowSize {
		window = zstd.MaxWindowSize
	}
	c.window = window
	c.decoders.New = func() any {
		dec, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxMemory(uint64(maxFrame)),
			zstd.WithDecoderMaxWindow(uint64(window)),
			// Never grow the output past the capacity Decompress sized.
			zstd.WithDecodeAllCapLimit(true),
		)
		if err != nil {
			return err
		}
		return dec
	}
	return c
}

// MaxFrameSize returns the limit the codec enforces.
func (c *Codec) MaxFrameSize() int { return c.maxFrame }

// GetBuffer returns a pooled buffer of length 0; give it back with PutBuffer.
func (c *Codec) GetBuffer() *[]byte {
	if b, ok := c.bufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 4096)
	return &b
}

// PutBuffer returns a buffer to the pool. Huge buffers are dropped so that
// one 4 MB call does not pin 4 MB forever.
func (c *Codec) PutBuffer(b *[]byte) {
	if cap(*b) > 1<<20 {
		return
	}
	*b = (*b)[:0]
	c.bufs.Put(b)
}

// AppendRequest appends the frame of a request (or, with KindEvent, an
// event) to dst and returns the extended slice.
func (c *Codec) AppendRequest(dst []byte, k Kind, m *qrpcpb.Request) ([]byte, error) {
	// A method value, not an interface: m stays on the caller's stack.
	return c.appendFrame(dst, k, m.SizeVT(), m.MarshalToSizedBufferVT)
}

// AppendResponse appends the frame of a response to dst.
func (c *Codec) AppendResponse(dst []byte, m *qrpcpb.Response) ([]byte, error) {
	return c.appendFrame(dst, KindResponse, m.SizeVT(), m.MarshalToSizedBufferVT)
}

func (c *Codec) appendFrame(dst []byte, k Kind, size int, marshal func([]byte) (int, error)) ([]byte, error) {
	if size+1 > c.maxFrame {
		return dst, fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLarge, size+1, c.maxFrame)
	}
	start := len(dst)
	dst = grow(dst, HeaderSize+size)
	payload := dst[start+HeaderSize : start+HeaderSize+size]
	if _, err := marshal(payload); err != nil {
		return dst[:start], fmt.Errorf("marshal: %w", err)
	}
	flag, zflag := k.flags()
	n := size
	if size > CompressThreshold {
		if zn, ok := c.compressInPlace(dst, start, size); ok {
			flag, n = zflag, zn
		}
	}
	dst[start+4] = flag
	binary.BigEndian.PutUint32(dst[start:], uint32(n+1))
	return dst[:start+HeaderSize+n], nil
}

// compressInPlace compresses the payload at dst[start+HeaderSize:] and, when
// smaller, copies the result over it.
func (c *Codec) compressInPlace(dst []byte, start, size int) (int, bool) {
	enc, ok := c.encoders.Get().(*zstd.Encoder)
	if !ok {
		return 0, false
	}
	defer c.encoders.Put(enc)
	tmp := c.GetBuffer()
	defer c.PutBuffer(tmp)
	payload := dst[start+HeaderSize : start+HeaderSize+size]
	out := enc.EncodeAll(payload, (*tmp)[:0])
	*tmp = out
	if len(out) >= size {
		return 0, false
	}
	copy(payload, out)
	return len(out), true
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// Reader reads frames from a stream. It is not safe for concurrent use.
type Reader struct {
	c   *Codec
	r   *bufio.Reader
	hdr [HeaderSize]byte
	buf []byte // raw payload
	dec []byte // decompressed payload

	// Abandon, when set, is asked before the buffer of a frame that is
	// still arriving grows past growStep: true stops reading and Next
	// returns ErrAbandoned (the stream is then out of sync and must be
	// dropped). It lets a client stop buffering a large answer nobody
	// waits for any more.
	Abandon func() bool
	// growing: a frame's payload is being read into a buffer grown past
	// growStep (see Growing).
	growing atomic.Bool
}

// Growing reports, from any goroutine, whether the reader is in the
// middle of a large frame (its buffer grown past growStep, the frame not
// yet complete).
func (fr *Reader) Growing() bool { return fr.growing.Load() }

// NewReader returns a frame reader over r.
func (c *Codec) NewReader(r io.Reader) *Reader {
	return &Reader{c: c, r: bufio.NewReaderSize(r, 32<<10)}
}

// Next reads one frame. The payload (decompressed when the flag says so) is
// valid until the next call. io.EOF means the stream ended between frames.
func (fr *Reader) Next() (Kind, []byte, error) {
	fr.shrink()
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			// A frame cut short is an error, unlike a clean end.
			return 0, nil, fmt.Errorf("read frame header: %w", err)
		}
		return 0, nil, err
	}
	l := binary.BigEndian.Uint32(fr.hdr[:4])
	if l < 1 {
		return 0, nil, fmt.Errorf("%w: %d", ErrBadLength, l)
	}
	if uint64(l) > uint64(fr.c.maxFrame) {
		return 0, nil, fmt.Errorf("%w: length prefix %d, limit %d", ErrFrameTooLarge, l, fr.c.maxFrame)
	}
	kind, compressed, err := Decode(fr.hdr[4])
	if err != nil {
		return 0, nil, err
	}
	if err := fr.readPayload(int(l) - 1); err != nil {
		return 0, nil, err
	}
	if !compressed {
		return kind, fr.buf, nil
	}
	out, err := fr.c.Decompress(fr.dec[:0], fr.buf)
	if err != nil {
		return 0, nil, err
	}
	fr.dec = out
	return kind, out, nil
}

// growStep is the most readPayload allocates ahead of the bytes it has
// actually received.
const growStep = 256 << 10

// readPayload reads n bytes into fr.buf. A large frame's buffer grows with
// the bytes that arrive rather than with what the length prefix promises, so
// a peer that sends only prefixes on many streams cannot make us allocate
// the maximum frame size on each.
func (fr *Reader) readPayload(n int) error {
	if cap(fr.buf) >= n {
		fr.buf = fr.buf[:n]
		if _, err := io.ReadFull(fr.r, fr.buf); err != nil {
			return fmt.Errorf("read frame payload: %w", noEOF(err))
		}
		return nil
	}
	got := 0
	fr.buf = fr.buf[:0]
	defer fr.growing.Store(false)
	for got < n {
		want := min(n, max(2*got, growStep))
		if got > 0 {
			fr.growing.Store(true)
			if fr.Abandon != nil && fr.Abandon() {
				fr.buf = nil
				return fmt.Errorf("%w (%d of %d bytes read)", ErrAbandoned, got, n)
			}
		}
		if cap(fr.buf) < want {
			nb := make([]byte, got, want)
			copy(nb, fr.buf[:got])
			fr.buf = nb
		}
		fr.buf = fr.buf[:want]
		m, err := io.ReadFull(fr.r, fr.buf[got:want])
		got += m
		if err != nil {
			return fmt.Errorf("read frame payload (%d of %d bytes): %w", got, n, noEOF(err))
		}
	}
	return nil
}

// noEOF turns a clean EOF inside a frame into io.ErrUnexpectedEOF: callers
// take io.EOF for the end of the stream between frames, and a frame cut
// short after its header is not that.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// shrink drops buffers that one unusually large frame left behind, so a
// stream that once carried 16 MiB does not pin 16 MiB for its lifetime. It
// runs at the start of Next, when the previous payload is no longer in use.
func (fr *Reader) shrink() {
	const keep = 1 << 20
	if cap(fr.buf) > keep {
		fr.buf = nil
	}
	if cap(fr.dec) > keep {
		fr.dec = nil
	}
}

// Decompress appends the decompressed form of src to dst, refusing output
// larger than the codec's limit.
//
// Memory stays bounded by about the limit whatever the input: klauspost's
// DecodeAll grows its output by append, so a bomb without a declared size
// would cost several times the limit in reallocations. Instead the output
// buffer is sized up front, from the frame's declared content size when it
// has one (checked against the limit before anything is allocated), and the
// decoder is told never to write past its capacity.
func (c *Codec) Decompress(dst, src []byte) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(src); err != nil {
		return dst, fmt.Errorf("%w: header: %v", ErrBadCompression, err)
	}
	limit := uint64(c.maxFrame)
	if h.HasFCS {
		if h.FrameContentSize > limit {
			return dst, fmt.Errorf("%w: declares %d bytes, limit %d", ErrTooLarge, h.FrameContentSize, limit)
		}
		// A frame that lies about its size is stopped by the decoder after at
		// most one block (128 KiB) too many; room for that block avoids a
		// reallocation on the way to the error.
		slack := uint64(compressedBlockOverAlloc)
		if h.FrameContentSize >= 1<<20 {
			slack += maxBlockSize
		}
		return c.decodeInto(dst, src, int(h.FrameContentSize+slack))
	}
	// No declared size (a streaming encoder, or a hostile peer): measure it
	// first by decoding into nothing, which costs the frame's window and no
	// output buffer, then decode for real into a buffer of exactly that size.
	// Twice the CPU on a path the reference encoder never takes.
	n, err := c.measure(src)
	if err != nil {
		return dst, err
	}
	return c.decodeInto(dst, src, n+compressedBlockOverAlloc)
}

// measure returns the decompressed size of a zstd frame without keeping the
// output, failing as soon as it passes the limit.
func (c *Codec) measure(src []byte) (int, error) {
	dec, err := zstd.NewReader(bytes.NewReader(src),
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(uint64(c.maxFrame)),
		zstd.WithDecoderMaxWindow(uint64(c.window)),
	)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrBadCompression, err)
	}
	// A streaming decoder keeps a window-sized history; this one is used once
	// so that no pool pins it.
	defer dec.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(dec, int64(c.maxFrame)+1))
	switch {
	case errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded):
		return 0, fmt.Errorf("%w: limit %d: %w", ErrTooLarge, c.maxFrame, err)
	case err != nil:
		return 0, fmt.Errorf("%w: %w", ErrBadCompression, err)
	case n > int64(c.maxFrame):
		return 0, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, c.maxFrame)
	}
	return int(n), nil
}

const (
	maxBlockSize             = 128 << 10 // zstd's Block_Maximum_Size
	compressedBlockOverAlloc = 64        // klauspost reads a little past the end in its fast path
)

// decodeInto decodes src after dst's contents into a buffer with room for
// at least room more bytes (dst's own if it has the space).
func (c *Codec) decodeInto(dst, src []byte, room int) ([]byte, error) {
	if cap(dst)-len(dst) < room {
		nd := make([]byte, len(dst), len(dst)+room)
		copy(nd, dst)
		dst = nd
	}
	dec, ok := c.decoders.Get().(*zstd.Decoder)
	if !ok {
		return dst, fmt.Errorf("%w: no decoder", ErrBadCompression)
	}
	defer c.decoders.Put(dec)
	out, err := dec.DecodeAll(src, dst)
	if err != nil {
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			return dst, fmt.Errorf("%w: limit %d: %w", ErrTooLarge, c.maxFrame, err)
		}
		return dst, fmt.Errorf("%w: %w", ErrBadCompression, err)
	}
	if len(out)-len(dst) > c.maxFrame {
		return dst, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(out)-len(dst), c.maxFrame)
	}
	return out, nil
}

// ParseFrame decodes one whole frame held in b (header included), for tests
// and tools; the payload aliases b unless it was compressed.
func (c *Codec) ParseFrame(b []byte) (Kind, []byte, error) {
	if len(b) < HeaderSize {
		return 0, nil, fmt.Errorf("%w: %d bytes", ErrBadLength, len(b))
	}
	l := binary.BigEndian.Uint32(b[:4])
	if l < 1 {
		return 0, nil, fmt.Errorf("%w: %d", ErrBadLength, l)
	}
	if uint64(l) > uint64(c.maxFrame) {
		return 0, nil, fmt.Errorf("%w: length prefix %d, limit %d", ErrFrameTooLarge, l, c.maxFrame)
	}
	if uint64(len(b)-4) != uint64(l) {
		return 0, nil, fmt.Errorf("%w: prefix says %d, have %d", ErrBadLength, l, len(b)-4)
	}
	kind, compressed, err := Decode(b[4])
	if err != nil {
		return 0, nil, err
	}
	if !compressed {
		return kind, b[HeaderSize:], nil
	}
	out, err := c.Decompress(nil, b[HeaderSize:])
	return kind, out, err
}
