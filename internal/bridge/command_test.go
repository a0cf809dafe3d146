package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

func unaryCommand() Command {
	return Command{Op: OpUnary, Conn: 3, CallID: 7, Method: []byte("greet"), Body: []byte("hello"),
		Hdrs: PackHeaders("x-id", "7"), NHdrs: 2}
}

func connectCommand() Command {
	return Command{Op: OpConnect, TimeoutMS: 1500, Conns: 2, Streams: 8, IdleTimeoutMS: 9000, MaxFrameSize: 1 << 20,
		Addr: []byte("127.0.0.1:9"), ServerName: []byte("qrpc.example"), CA: []byte("CA PEM"),
		Pins: bytes.Repeat([]byte{0xab}, 64)}
}

// checkCase is a command that Check must refuse: base() with mod applied.
type checkCase struct {
	name string
	base func() Command
	mod  func(c *Command)
	want string // in the error
}

func runCheckCases(t *testing.T, cases []checkCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.base()
			if err := c.Check(); err != nil {
				t.Fatalf("the base command fails: %v", err)
			}
			tc.mod(&c)
			err := c.Check()
			if err == nil || !errors.Is(err, ErrBadCommand) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a bad command error containing %q", err, tc.want)
			}
			if st, _ := StatusOf(err); st != ErrBadArg {
				t.Fatalf("status %d, want %d", st, ErrBadArg)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	runCheckCases(t, []checkCase{
		{"op zero", unaryCommand, func(c *Command) { c.Op = 0 }, "unknown op 0"},
		{"op too big", unaryCommand, func(c *Command) { c.Op = 99 }, "unknown op 99"},
		{"odd headers", unaryCommand, func(c *Command) { c.NHdrs = 3 }, "odd number of header entries"},
		{"too many headers", unaryCommand, func(c *Command) { c.NHdrs = maxHeaders + 2 }, "header entries"},
		{"negative timeout", unaryCommand, func(c *Command) { c.TimeoutMS = -1 }, "negative timeout"},
		{"empty method", unaryCommand, func(c *Command) { c.Method = nil }, "empty method"},
		{"no handle", unaryCommand, func(c *Command) { c.Conn = 0 }, "no connection handle"},
		{"close without handle", unaryCommand, func(c *Command) { c.Op, c.Conn = OpClose, 0 }, "no connection handle"},
		{"no addr", connectCommand, func(c *Command) { c.Addr = nil }, "empty address"},
		{"pins", connectCommand, func(c *Command) { c.Pins = c.Pins[:33] }, "not a multiple of 32"},
		{"conns", connectCommand, func(c *Command) { c.Conns = 65 }, "conns must be"},
		{"negative conns", connectCommand, func(c *Command) { c.Conns = -1 }, "conns must be"},
		{"streams", connectCommand, func(c *Command) { c.Streams = 5000 }, "streams must be"},
		{"idle", connectCommand, func(c *Command) { c.IdleTimeoutMS = -5 }, "negative idle timeout"},
		{"frame", connectCommand, func(c *Command) { c.MaxFrameSize = 10 }, "max frame size"},
		{"cert without key", connectCommand, func(c *Command) { c.Cert = []byte("x") }, "cert and key go together"},
	})
}

func TestView(t *testing.T) {
	b := []byte("abc")
	v, err := View(unsafe.Pointer(&b[0]), 3, "body")
	if err != nil || &v[0] != &b[0] || len(v) != 3 {
		t.Fatalf("view %q %v", v, err)
	}
	if v, err := View(nil, 0, "body"); v != nil || err != nil {
		t.Fatalf("empty: %q %v", v, err)
	}
	if _, err := View(nil, 5, "body"); err == nil || !strings.Contains(err.Error(), "body: NULL pointer with length 5") {
		t.Fatalf("NULL: %v", err)
	}
	if _, err := View(unsafe.Pointer(&b[0]), 1<<40, "body"); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("huge: %v", err)
	}
}

func TestConnectConfig(t *testing.T) {
	cmd := connectCommand()
	addrs, pcfg, err := connectConfig(&cmd, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	addr, cfg := addrs[0], &pcfg.Config
	if len(addrs) != 1 || addr != "127.0.0.1:9" || cfg.ServerName != "qrpc.example" || string(cfg.CAPEM) != "CA PEM" ||
		cfg.Conns != 2 || cfg.Streams != 8 || cfg.DialTimeout.Milliseconds() != 1500 ||
		cfg.IdleTimeout.Milliseconds() != 9000 || cfg.MaxFrameSize != 1<<20 || len(cfg.Pins) != 2 {
		t.Fatalf("config %+v from %q", cfg, addr)
	}
	// The dial outlives the caller's memory: the config must not alias it.
	if &cfg.CAPEM[0] == &cmd.CA[0] || &cfg.Pins[0][0] == &cmd.Pins[0] {
		t.Fatal("connect config aliases the command")
	}
}

func TestParseHeaders(t *testing.T) {
	block := PackHeaders("a", "1", "", "empty key", "k", "")
	h, err := ParseHeaders(block, 6, nil)
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
		{"fewer than announced", PackHeaders("a", "b"), 4, "truncated"},
		{"length past the end", append(PackHeaders("abc")[:4:4], "ab"...), 1, "says 3 bytes"},
		{"trailing bytes", append(PackHeaders("a", "b"), 0), 2, "after the 2 entries"},
		{"block without count", PackHeaders("a", "b"), 0, "after the 0 entries"},
	} {
		if _, err := ParseHeaders(tc.block, tc.n, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestResultBlob(t *testing.T) {
	mem := newGoMemory(t)
	r := New(mem, nil)
	hdrs := [][]byte{[]byte("content-type"), []byte("text/plain"), []byte("x"), nil}
	body := bytes.Repeat([]byte("z"), 1000)
	c := r.Result(42, hdrs, body)
	if c.Status != StatusOK || c.Data == nil || int(c.Len) != ResultSize(hdrs, body) {
		t.Fatalf("completion %+v", c)
	}
	code, h, b := result(t, c)
	if code != 42 || !bytes.Equal(b, body) || h != "content-type|text/plain|x|" {
		t.Fatalf("code %d, headers %q, body %d bytes", code, h, len(b))
	}
	SetAttempts(c, 3)
	if n := ResultAttempts(Bytes(c.Data, int(c.Len))); n != 3 {
		t.Fatalf("attempts %d after SetAttempts(3)", n)
	}
	if code, h, b = result(t, c); code != 42 || !bytes.Equal(b, body) || h != "content-type|text/plain|x|" {
		t.Fatalf("after SetAttempts: code %d, headers %q, body %d bytes", code, h, len(b))
	}
	r.Free(&c)

	// A bad response's blob follows its message.
	bad := r.badResponse("bad response: x", &qrpc.Response{Code: 7, Body: []byte("raw")})
	SetAttempts(bad, 2)
	msg, bcode, _, bbody, err := ParseBadResponse(Bytes(bad.Data, int(bad.Len)))
	blob := Bytes(bad.Data, int(bad.Len))[4+len(msg):]
	if err != nil || bcode != 7 || string(bbody) != "raw" || ResultAttempts(blob) != 2 {
		t.Fatalf("bad response after SetAttempts(2): %q code %d body %q attempts %d (%v)", msg, bcode, bbody, ResultAttempts(blob), err)
	}
	r.Free(&bad)

	empty := r.Result(0, nil, nil)
	if empty.Len != ResultHead || ResultAttempts(Bytes(empty.Data, ResultHead)) != 1 {
		t.Fatalf("empty result is %d bytes, want %d with 1 attempt", empty.Len, ResultHead)
	}
	r.Free(&empty)

	e := r.Message(ErrTimeout, "timeout", 9)
	if e.Len != 7 || e.CallID != 9 || string(Bytes(e.Data, int(e.Len)+1)) != "timeout\x00" {
		t.Fatalf("error message %q", Bytes(e.Data, int(e.Len)+1))
	}
	r.Free(&e)

	// Out of memory is an error completion, not a crash.
	mem.fail = true
	if c := r.Result(0, nil, body); c.Status != ErrGeneric || c.Data != nil {
		t.Fatalf("result without memory: %+v", c)
	}
}

func TestStatusOf(t *testing.T) {
	cases := []struct {
		err    error
		status int32
		msg    string
	}{
		{qrpc.ErrTimeout, ErrTimeout, "timeout"},
		{fmt.Errorf("%w: %w", qrpc.ErrTimeout, context.DeadlineExceeded), ErrTimeout, "timeout"},
		{qrpc.ErrClosed, ErrClosed, "closed"},
		{context.Canceled, ErrClosed, "closed"},
		{qrpc.ErrQueueFull, ErrFull, "queue full"},
		{&qrpc.DialError{Addr: "127.0.0.1:1", Reason: "refused", Err: errors.New("read: connection refused")}, ErrConnect, "connect: refused"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, "reconnecting"), ErrUnavail, "unavailable: reconnecting"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, &qrpc.DialError{Addr: "a", Reason: "timeout", Err: errors.New("x")}), ErrUnavail, "unavailable: timeout\x1fa: x\x1f0\x1f0"},
		{fmt.Errorf("%w: %v", qrpc.ErrConnLost, "peer went away"), ErrLost, "connection lost: other\x1fpeer went away\x1f0\x1f0"},
		{fmt.Errorf("%w: %v", qrpc.ErrTooLarge, "frame of 20 MiB"), ErrTooBig, "too large: request exceeds max_frame_size\x1fframe of 20 MiB\x1f0\x1f0"},
		{fmt.Errorf("%w: ca: no PEM certificate found", qrpc.ErrBadConfig), ErrBadArg, "bad config: ca: no PEM certificate found"},
		{Badf("empty method"), ErrBadArg, "bad command: empty method"},
		{errors.New("qrpc: something else"), ErrGeneric, "something else"},
		{errors.New(strings.Repeat("x", 1000)), ErrGeneric, strings.Repeat("x", maxMsgLen-3) + "..."},
	}
	for _, tc := range cases {
		st, msg := StatusOf(tc.err)
		if st != tc.status || msg != tc.msg {
			t.Errorf("%v: got (%d, %q), want (%d, %q)", tc.err, st, msg, tc.status, tc.msg)
		}
	}
	if st, msg := StatusOf(nil); st != StatusOK || msg != "" {
		t.Errorf("nil: (%d, %q)", st, msg)
	}
}

// Every successful submit maps its nil error: that must not allocate
// (it did, through the *DialError that errors.As needs, seen in perf).
func TestStatusOfNilAllocatesNothing(t *testing.T) {
	var err error
	if n := testing.AllocsPerRun(100, func() { StatusOf(err) }); n != 0 {
		t.Fatalf("StatusOf(nil) allocates %.0f objects", n)
	}
}
