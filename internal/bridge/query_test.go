package bridge

import (
	"fmt"
	"testing"
)

func TestCheckVersion2Fields(t *testing.T) {
	event := func() Command { c := unaryCommand(); c.Op = OpEvent; return c }
	runCheckCases(t, []checkCase{
		{"unknown flag", unaryCommand, func(c *Command) { c.Flags = 34 }, "unknown flags 0x20"},
		{"negative retries", unaryCommand, func(c *Command) { c.Retries = -1 }, "retries must be 0..16, got -1"},
		{"too many retries", unaryCommand, func(c *Command) { c.Retries = 17 }, "retries must be 0..16, got 17"},
		{"retries on an event", event, func(c *Command) { c.Retries = 1 }, "retries: only for UNARY"},
		{"long hash key", unaryCommand, func(c *Command) { c.HashKey = make([]byte, maxHashKey+1) }, "hash_key: 65537 bytes"},
		{"hash key on close", unaryCommand, func(c *Command) { c.Op, c.HashKey = OpClose, []byte("k") }, "hash_key: only for UNARY and EVENT"},
		{"long req_type", unaryCommand, func(c *Command) { c.ReqType = make([]byte, maxTypeName+1) }, "req_type: 1025 bytes"},
		{"req_type on connect", connectCommand, func(c *Command) { c.ReqType = []byte("a.B") }, "req_type: only for UNARY and EVENT"},
		{"long resp_type", unaryCommand, func(c *Command) { c.RespType = make([]byte, maxTypeName+1) }, "resp_type: 1025 bytes"},
		{"resp_type on an event", event, func(c *Command) { c.RespType = []byte("a.B") }, "resp_type: only for UNARY"},
		{"long opts", connectCommand, func(c *Command) { c.Opts = make([]byte, maxOpts+1) }, "opts: 1048577 bytes"},
		// Features that have not landed refuse their fields rather than
		// ignore them.
	})
	// A query op's opts are its own business.
	q := Command{Op: OpConfigure, Opts: []byte("gomaxprocs=1\n")}
	if err := q.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestQuery(t *testing.T) {
	r := New(newGoMemory(t), nil)
	h := newTestHost(t, r, true)

	// Ops no feature has registered are refused.
	for _, op := range []uint32{OpPeers, OpMetrics, OpProtoLoad, OpConfigure, OpProfile} {
		queryMu.RLock()
		_, registered := queries[op]
		queryMu.RUnlock()
		if registered {
			continue
		}
		if out, msg := r.Query(&Command{Op: op}); out.Status != ErrBadArg || out.Data != nil || msg != fmt.Sprintf("unsupported op %d", op) {
			t.Errorf("op %d: %d %q", op, out.Status, msg)
		}
	}
	// Commands of qrpc_submit_async are not queries, and the reverse.
	if out, msg := r.Query(&Command{Op: OpEcho}); out.Status != ErrBadArg || msg != "bad command: op 6 is not a query: use qrpc_submit_async" {
		t.Errorf("echo as a query: %d %q", out.Status, msg)
	}
	// 7 is no op, neither way.
	if out, msg := r.Query(&Command{Op: 7}); out.Status != ErrBadArg || msg != "bad command: unknown op 7" {
		t.Errorf("op 7 as a query: %d %q", out.Status, msg)
	}
	if msg := h.submit(Command{Op: 7}, ErrBadArg); msg != "bad command: unknown op 7" {
		t.Errorf("op 7 submitted: %q", msg)
	}
	if msg := h.submit(Command{Op: OpMetrics}, ErrBadArg); msg != "bad command: op 9 is a query: use qrpc_query" {
		t.Errorf("query op submitted: %q", msg)
	}
	if out, msg := r.Query(&Command{Op: lastOp + 1}); out.Status != ErrBadArg || msg != fmt.Sprintf("bad command: unknown op %d", lastOp+1) {
		t.Errorf("op %d: %d %q", lastOp+1, out.Status, msg)
	}

	// A registered op: its result is copied into the host's memory, its
	// errors mapped like the other commands'. CONFIGURE's own function
	// (configure.go) steps aside for the test's and comes back after.
	queryMu.Lock()
	own := queries[OpConfigure]
	delete(queries, OpConfigure)
	queryMu.Unlock()
	t.Cleanup(func() {
		if own != nil {
			RegisterQuery(OpConfigure, own)
		}
	})
	RegisterQuery(OpConfigure, func(r *Runtime, cmd *Command) ([]byte, error) {
		switch string(cmd.Opts) {
		case "":
			return nil, nil
		case "bad":
			return nil, Badf("opts: unknown key %q", "bad")
		}
		return append([]byte("applied "), cmd.Opts...), nil
	})
	t.Cleanup(func() { unregisterQuery(OpConfigure) })
	out, msg := r.Query(&Command{Op: OpConfigure, Opts: []byte("gomaxprocs=1")})
	if out.Status != StatusOK || msg != "" || text(out) != "applied gomaxprocs=1" {
		t.Fatalf("configure: %d %q %q", out.Status, msg, text(out))
	}
	r.Free(&out)
	out, _ = r.Query(&Command{Op: OpConfigure})
	if out.Status != StatusOK || out.Data == nil || out.Len != 0 {
		t.Fatalf("empty result: %+v", out)
	}
	r.Free(&out)
	if out, msg := r.Query(&Command{Op: OpConfigure, Opts: []byte("bad")}); out.Status != ErrBadArg || msg != `bad command: opts: unknown key "bad"` || out.Data != nil {
		t.Fatalf("failing query: %d %q", out.Status, msg)
	}

	for _, bad := range []func(){
		func() { RegisterQuery(OpConfigure, func(*Runtime, *Command) ([]byte, error) { return nil, nil }) },
		func() { RegisterQuery(OpEcho, func(*Runtime, *Command) ([]byte, error) { return nil, nil }) },
		func() { RegisterQuery(OpPeers, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("RegisterQuery accepted a bad registration")
				}
			}()
			bad()
		}()
	}
}
