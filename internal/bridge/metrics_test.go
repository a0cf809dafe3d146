package bridge

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// TestMetricsRecording: calls, events, timeouts and a cancel over a real
// connection show in the worker's metrics with exact counts.
func TestMetricsRecording(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	r := New(newGoMemory(t), nil)
	h := newTestHost(t, r, true)
	conn := h.connect(1, ts)
	id := uint64(10)
	for i := 0; i < 4; i++ {
		id++
		h.submit(unary(conn, id, "echo", "x", 5000), StatusPending)
		h.wait(id, 5*time.Second)
	}
	id++
	h.submit(unary(conn, id, "code", "", 5000), StatusPending)
	h.wait(id, 5*time.Second)
	id++
	h.submit(unary(conn, id, "sleep", "2000", 50), StatusPending)
	h.wait(id, 5*time.Second)
	id++
	h.submit(unary(conn, id, "sleep", "300", 5000), StatusPending)
	h.submit(Command{Op: OpCancel, CallID: id}, StatusOK)
	for i := 0; i < 2; i++ {
		ev := unary(conn, 0, "ev", "e", 0)
		ev.Op = OpEvent
		h.submit(ev, StatusOK)
	}

	out, err := r.MetricsQuery("", nil)
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	srv := `server="` + ts.Addr + `"`
	for _, want := range []string{
		`qrpc_client_calls_total{method="echo",` + srv + `,result="ok"} 4`,
		`qrpc_client_calls_total{method="code",` + srv + `,result="code"} 1`,
		`qrpc_client_calls_total{method="sleep",` + srv + `,result="timeout"} 1`,
		`qrpc_client_calls_total{method="sleep",` + srv + `,result="ok"} 0`, // the cancelled one is not counted
		`qrpc_client_calls_total{method="sleep",` + srv + `,result="closed"} 0`,
		`qrpc_client_call_duration_seconds_count{method="sleep",` + srv + `} 1`,
		`qrpc_client_call_duration_seconds_count{method="echo",` + srv + `} 4`,
		`qrpc_client_events_total{method="ev",` + srv + `,result="sent"} 2`,
		`qrpc_client_inflight{` + srv + `} 0`,
		`qrpc_client_connections{` + srv + `,state="up"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("missing %s", want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", text)
	}

	// Two connections to one server: up while either is open.
	conn2 := h.connect(2, ts)
	h.submit(Command{Op: OpClose, Conn: conn2}, StatusOK)
	// The close runs on a goroutine: wait (bounded) for the gauge to move
	// off 2; it must stop at 1.
	var cur []byte
	testwait.For(5*time.Second, func() bool {
		cur, _ = r.MetricsQuery("", nil)
		return !strings.Contains(string(cur), `qrpc_client_connections{`+srv+`,state="up"} 2`+"\n")
	})
	if !strings.Contains(string(cur), `qrpc_client_connections{`+srv+`,state="up"} 1`+"\n") {
		t.Fatalf("one of two connections closed, the server is no longer up:\n%s", cur)
	}

	// Closed: the connection leaves the "up" state.
	h.submit(Command{Op: OpClose, Conn: conn}, StatusOK)
	if !testwait.For(5*time.Second, func() bool {
		out, _ = r.MetricsQuery("", nil)
		return strings.Contains(string(out), `qrpc_client_connections{`+srv+`,state="up"} 0`+"\n")
	}) {
		t.Fatalf("still up after close:\n%s", out)
	}
	if _, err := r.MetricsQuery("bogus", nil); err == nil {
		t.Fatal("unknown metrics query accepted")
	}
}

// TestReasonMessage: the error a caller compares is "word: reason" alone;
// the detail crosses in a field of its own, shortened to fit.
func TestReasonMessage(t *testing.T) {
	long := strings.Repeat("z", 1000)
	cases := []struct {
		err    error
		head   string
		detail string // a prefix
	}{
		{&qrpc.DialError{Addr: "a:1", Reason: qrpc.ReasonTimeout, Err: errors.New("x")}, "connect: timeout", ""},
		{fmt.Errorf("%w: %w", qrpc.ErrConnLost, &quic.ApplicationError{Remote: true, ErrorMessage: long}), "connection lost: closed by server", "Application error 0x0 (remote): zzz"},
		{fmt.Errorf("%w: %v", qrpc.ErrUnavailable, &quic.StatelessResetError{}), "unavailable: stateless reset", "received a stateless reset"},
		{fmt.Errorf("%w: headers", qrpc.ErrTooLarge), "too large: request exceeds max_frame_size", ""},
		{qrpc.ErrTimeout, "timeout", ""},
	}
	for _, c := range cases {
		_, msg := StatusOf(c.err)
		if len(msg) > 512 {
			t.Errorf("%d bytes: %q", len(msg), msg)
		}
		head, detail, _, _ := DecodeMessage(msg)
		if head != c.head || !strings.HasPrefix(detail, c.detail) {
			t.Errorf("%v: got %q / %q, want %q / %q...", c.err, head, detail, c.head, c.detail)
		}
	}
	// attempts and the budget never decorate the word
	for _, budget := range []bool{false, true} {
		_, msg := StatusOf(&qrpc.AttemptsError{Err: qrpc.ErrTimeout, Attempts: 2, Budget: budget})
		head, _, n, b := DecodeMessage(msg)
		if head != "timeout" || n != 2 || b != budget {
			t.Errorf("budget %v: %q", budget, msg)
		}
	}
}

// TestMetricsQueryOp: QRPC_OP_METRICS through the query registry; the
// snapshot and the render input are record blocks.
func TestMetricsQueryOp(t *testing.T) {
	mem := newGoMemory(t)
	r := New(mem, nil)
	r.metrics.Pool("").PeerOf("s:1").CallDone([]byte("m"), 0, nil, time.Millisecond)
	sample := func(series string, key uint16, v float64) string {
		return string(AppendFloat(AppendStr(nil, KeySampleSeries, series), key, v))
	}
	okSeries := `qrpc_client_calls_total{method="m",server="s:1",result="ok"}`
	x := `qrpc_client_calls_total{method="x",server="s:2",result="ok"}`
	for _, tc := range []struct{ what, body, want string }{
		{"", "", okSeries + " 1\n"},
		{"snapshot", "", sample(okSeries, KeySampleCounter, 1)},
		{"snapshot", "", sample(`qrpc_client_inflight{server="s:1"}`, KeySampleGauge, 0)},
		{"render", sample(x, KeySampleCounter, 7) + sample("g1 "+x, KeySampleCounter, 1), x + " 8\n"},
	} {
		c, msg := r.Query(&Command{Op: OpMetrics, Method: []byte(tc.what), Body: []byte(tc.body)})
		if c.Status != StatusOK {
			t.Fatalf("%q: %d %s", tc.what, c.Status, msg)
		}
		got := string(Bytes(c.Data, int(c.Len)))
		mem.Free(c.Data)
		if !strings.Contains(got, tc.want) {
			t.Errorf("%q: no %q in\n%q", tc.what, tc.want, got)
		}
	}
	for _, bad := range []struct{ body, msg string }{
		{sample(`qrpc_client_calls_total{method="x 1`, KeySampleCounter, 1), "bad sample"},
		{string(AppendFloat(nil, KeySampleCounter, 1)), "without its series"},
		{"xx", "cut short"},
	} {
		c, msg := r.Query(&Command{Op: OpMetrics, Method: []byte("render"), Body: []byte(bad.body)})
		if c.Status != ErrBadArg || !strings.Contains(msg, bad.msg) {
			t.Errorf("bad dump %q: %d %q, want %q", bad.body, c.Status, msg, bad.msg)
		}
	}
}
