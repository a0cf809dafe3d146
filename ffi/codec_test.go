package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

func TestABILayoutMatchesHeader(t *testing.T) {
	if err := abiLayoutErr(); err != nil {
		t.Fatal(err)
	}
	if sizeofCmd != unsafe.Sizeof(cmdABI{}) {
		t.Fatalf("sizeofCmd %d, Go mirror %d", sizeofCmd, unsafe.Sizeof(cmdABI{}))
	}
}

// ptr returns the address of b's first byte and its length, as a C caller
// would fill a (pointer, length) pair.
func ptr(b []byte) (unsafe.Pointer, uintptr) {
	if len(b) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&b[0]), uintptr(len(b))
}

// packHeaders builds the packed [u32 len][bytes] block of qrpc.h.
func packHeaders(kv ...string) []byte {
	var b []byte
	for _, s := range kv {
		b = binary.NativeEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

func unaryCmd(conn uint64, method, body string, hdrs ...string) *cmdABI {
	c := &cmdABI{Version: cmdVersion, Op: opUnary, Conn: conn, CallID: 7, NHdrs: uint32(len(hdrs))}
	c.Method, c.MethodLen = ptr([]byte(method))
	c.Body, c.BodyLen = ptr([]byte(body))
	c.Hdrs, c.HdrsLen = ptr(packHeaders(hdrs...))
	return c
}

func TestDecodeCmd(t *testing.T) {
	good := unaryCmd(3, "greet", "hello", "x-id", "7")
	cmd, err := decodeCmd(good)
	if err != nil {
		t.Fatal(err)
	}
	if cmd.op != opUnary || cmd.conn != 3 || cmd.callID != 7 || string(cmd.method) != "greet" || string(cmd.body) != "hello" {
		t.Fatalf("decoded %+v", cmd)
	}
	// The views alias the caller's memory: no copy.
	if unsafe.Pointer(&cmd.body[0]) != good.Body {
		t.Fatal("body was copied")
	}

	cases := []struct {
		name string
		mod  func(c *cmdABI)
		want string
	}{
		{"version", func(c *cmdABI) { c.Version = 2 }, "version 2"},
		{"op zero", func(c *cmdABI) { c.Op = 0 }, "unknown op 0"},
		{"op too big", func(c *cmdABI) { c.Op = 8 }, "unknown op 8"},
		{"null with length", func(c *cmdABI) { c.Body, c.BodyLen = nil, 5 }, "body: NULL pointer with length 5"},
		{"huge length", func(c *cmdABI) { c.BodyLen = 1 << 40 }, "body: length"},
		{"odd headers", func(c *cmdABI) { c.NHdrs = 3 }, "odd number of header entries"},
		{"too many headers", func(c *cmdABI) { c.NHdrs = maxHeaders + 2 }, "header entries"},
		{"negative timeout", func(c *cmdABI) { c.TimeoutMS = -1 }, "negative timeout"},
		{"empty method", func(c *cmdABI) { c.Method, c.MethodLen = nil, 0 }, "empty method"},
		{"no handle", func(c *cmdABI) { c.Conn = 0 }, "no connection handle"},
		{"close without handle", func(c *cmdABI) { c.Op, c.Conn = opClose, 0 }, "no connection handle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := *good
			tc.mod(&c)
			_, err := decodeCmd(&c)
			if err == nil || !errors.Is(err, errBadCommand) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a bad command error containing %q", err, tc.want)
			}
			if st, _ := statusOf(err); st != errBadArg {
				t.Fatalf("status %d, want %d", st, errBadArg)
			}
		})
	}
	if _, err := decodeCmd(nil); err == nil {
		t.Fatal("NULL command accepted")
	}
}

func TestDecodeConnect(t *testing.T) {
	base := func() *cmdABI {
		c := &cmdABI{Version: cmdVersion, Op: opConnect, TimeoutMS: 1500, Conns: 2, Streams: 8, IdleTimeoutMS: 9000, MaxFrameSize: 1 << 20}
		c.Addr, c.AddrLen = ptr([]byte("127.0.0.1:9"))
		c.ServerName, c.ServerNameLen = ptr([]byte("qrpc.example"))
		c.CA, c.CALen = ptr([]byte("CA PEM"))
		c.Pins, c.PinsLen = ptr(bytes.Repeat([]byte{0xab}, 64))
		return c
	}
	cmd, err := decodeCmd(base())
	if err != nil {
		t.Fatal(err)
	}
	addr, cfg := connectConfig(&cmd, slog.Default())
	if addr != "127.0.0.1:9" || cfg.ServerName != "qrpc.example" || string(cfg.CAPEM) != "CA PEM" ||
		cfg.Conns != 2 || cfg.Streams != 8 || cfg.DialTimeout.Milliseconds() != 1500 ||
		cfg.IdleTimeout.Milliseconds() != 9000 || cfg.MaxFrameSize != 1<<20 || len(cfg.Pins) != 2 {
		t.Fatalf("config %+v from %q", cfg, addr)
	}
	// The dial outlives the caller's memory: the config must not alias it.
	if &cfg.CAPEM[0] == &cmd.ca[0] || &cfg.Pins[0][0] == &cmd.pins[0] {
		t.Fatal("connect config aliases the command")
	}

	cases := []struct {
		name string
		mod  func(c *cmdABI)
		want string
	}{
		{"no addr", func(c *cmdABI) { c.Addr, c.AddrLen = nil, 0 }, "empty address"},
		{"pins", func(c *cmdABI) { c.PinsLen = 33 }, "not a multiple of 32"},
		{"conns", func(c *cmdABI) { c.Conns = 65 }, "conns must be"},
		{"negative conns", func(c *cmdABI) { c.Conns = -1 }, "conns must be"},
		{"streams", func(c *cmdABI) { c.Streams = 5000 }, "streams must be"},
		{"idle", func(c *cmdABI) { c.IdleTimeoutMS = -5 }, "negative idle timeout"},
		{"frame", func(c *cmdABI) { c.MaxFrameSize = 10 }, "max frame size"},
		{"cert without key", func(c *cmdABI) { c.Cert, c.CertLen = ptr([]byte("x")) }, "cert and key go together"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mod(c)
			if _, err := decodeCmd(c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestParseHeaders(t *testing.T) {
	block := packHeaders("a", "1", "", "empty key", "k", "")
	h, err := parseHeaders(block, 6, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "1", "", "empty key", "k", ""}
	if len(h) != len(want) {
		t.Fatalf("%d entries", len(h))
	}
	for i := range want {
		if string(h[i]) != want[i] {
			t.Fatalf("entry %d = %q, want %q", i, h[i], want[i])
		}
	}
	// An entry must not be appendable into its neighbour.
	if cap(h[0]) != len(h[0]) {
		t.Fatal("entry capacity reaches into the next one")
	}
	for _, tc := range []struct {
		name  string
		block []byte
		n     uint32
		want  string
	}{
		{"fewer than announced", packHeaders("a", "b"), 4, "truncated"},
		{"length past the end", append(binary.NativeEndian.AppendUint32(nil, 100), "abc"...), 1, "says 100 bytes"},
		{"trailing bytes", append(packHeaders("a", "b"), 0), 2, "after the 2 entries"},
		{"block without count", packHeaders("a", "b"), 0, "after the 0 entries"},
	} {
		if _, err := parseHeaders(tc.block, tc.n, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

// readResult decodes a result blob the way the Lua side does.
func readResult(t testing.TB, b []byte) (uint32, []string, []byte) {
	t.Helper()
	if len(b) < 8 {
		t.Fatalf("blob of %d bytes", len(b))
	}
	code := binary.NativeEndian.Uint32(b)
	hl := binary.NativeEndian.Uint32(b[4:])
	if int(hl) > len(b)-8 {
		t.Fatalf("hdrs_len %d in a blob of %d", hl, len(b))
	}
	var hdrs []string
	h := b[8 : 8+hl]
	for len(h) > 0 {
		n := binary.NativeEndian.Uint32(h)
		hdrs = append(hdrs, string(h[4:4+n]))
		h = h[4+n:]
	}
	return code, hdrs, b[8+hl:]
}

func TestResultBlob(t *testing.T) {
	hdrs := [][]byte{[]byte("content-type"), []byte("text/plain"), []byte("x"), nil}
	body := bytes.Repeat([]byte("z"), 1000)
	c := resultCompletion(42, hdrs, body)
	defer c.free()
	if c.status != statusOK || c.data == nil || c.n != resultSize(hdrs, body) {
		t.Fatalf("completion %+v", c)
	}
	code, h, b := readResult(t, cBuf(c.data, c.n))
	if code != 42 || !bytes.Equal(b, body) || strings.Join(h, "|") != "content-type|text/plain|x|" {
		t.Fatalf("code %d, headers %q, body %d bytes", code, h, len(b))
	}

	empty := resultCompletion(0, nil, nil)
	defer empty.free()
	if empty.n != 8 {
		t.Fatalf("empty result is %d bytes", empty.n)
	}

	e := errorCompletion(errTimeout, "timeout")
	defer e.free()
	if e.n != 7 || string(cBuf(e.data, e.n+1)) != "timeout\x00" {
		t.Fatalf("error message %q", cBuf(e.data, e.n+1))
	}
}

func TestStatsBlob(t *testing.T) {
	s := statsABI{Inflight: 1, Calls: 2, Events: 3, Dropped: 4, Reconnects: 5, Queued: 6}
	c := statsCompletion(s)
	defer c.free()
	_, h, b := readResult(t, cBuf(c.data, c.n))
	if len(h) != 0 || len(b) != int(unsafe.Sizeof(s)) {
		t.Fatalf("stats body %d bytes, headers %q", len(b), h)
	}
	got := *(*statsABI)(unsafe.Pointer(&b[0]))
	if got != s {
		t.Fatalf("stats %+v, want %+v", got, s)
	}
}

func TestStatusOf(t *testing.T) {
	cases := []struct {
		err    error
		status int32
		msg    string
	}{
		{qrpc.ErrTimeout, errTimeout, "timeout"},
		{fmt.Errorf("%w: %w", qrpc.ErrTimeout, context.DeadlineExceeded), errTimeout, "timeout"},
		{qrpc.ErrClosed, errClosed, "closed"},
		{context.Canceled, errClosed, "closed"},
		{qrpc.ErrQueueFull, errFull, "queue full"},
		{&qrpc.DialError{Addr: "127.0.0.1:1", Reason: "refused", Err: errors.New("read: connection refused")}, errConnect, "connect: refused"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, "reconnecting"), errUnavail, "unavailable: reconnecting"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, &qrpc.DialError{Addr: "a", Reason: "timeout", Err: errors.New("x")}), errUnavail, "unavailable: connect a: timeout: x"},
		{fmt.Errorf("%w: %v", qrpc.ErrConnLost, "peer went away"), errLost, "connection lost: peer went away"},
		{fmt.Errorf("%w: %v", qrpc.ErrTooLarge, "frame of 20 MiB"), errTooBig, "too large: frame of 20 MiB"},
		{fmt.Errorf("%w: ca: no PEM certificate found", qrpc.ErrBadConfig), errBadArg, "bad config: ca: no PEM certificate found"},
		{badf("empty method"), errBadArg, "bad command: empty method"},
		{errors.New("qrpc: something else"), errGeneric, "something else"},
		{errors.New(strings.Repeat("x", 1000)), errGeneric, strings.Repeat("x", maxMsgLen-3) + "..."},
	}
	for _, tc := range cases {
		st, msg := statusOf(tc.err)
		if st != tc.status || msg != tc.msg {
			t.Errorf("%v: got (%d, %q), want (%d, %q)", tc.err, st, msg, tc.status, tc.msg)
		}
	}
	if st, msg := statusOf(nil); st != statusOK || msg != "" {
		t.Errorf("nil: (%d, %q)", st, msg)
	}
}

func TestLogLevelsAndFormat(t *testing.T) {
	for _, tc := range []struct {
		l    slog.Level
		want uint32
	}{
		{slog.LevelError, ngxLogErr}, {slog.LevelError + 4, ngxLogErr},
		{slog.LevelWarn, ngxLogWarn}, {slog.LevelInfo, ngxLogNotice},
		{slog.LevelInfo - 2, ngxLogInfo}, {slog.LevelDebug, ngxLogDebug},
	} {
		if got := ngxLevel(tc.l); got != tc.want {
			t.Errorf("ngxLevel(%v) = %d, want %d", tc.l, got, tc.want)
		}
	}
	var sb strings.Builder
	h := newLogHandler().WithGroup("g").WithAttrs([]slog.Attr{slog.String("addr", "127.0.0.1:1")})
	_ = h
	appendAttr(&sb, "", slog.String("err", "read: connection refused"))
	appendAttr(&sb, "", slog.Int("n", 3))
	appendAttr(&sb, "p.", slog.Group("s", slog.String("k", "v")))
	if got := sb.String(); got != ` err="read: connection refused" n=3 p.s.k=v` {
		t.Fatalf("formatted %q", got)
	}
}
