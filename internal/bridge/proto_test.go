package bridge

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

const greeterProto = "../../demo/proto/greeter.proto"

func protoLoadCmd(method, body, opts string) *Command {
	return &Command{Op: OpProtoLoad, Method: []byte(method), Body: []byte(body), Opts: recs(opts)}
}

func TestProtoLoadQuery(t *testing.T) {
	r := New(newGoMemory(t), nil)
	cases := []struct {
		name   string
		cmd    *Command
		status int32
		msg    string // prefix
	}{
		{"file", protoLoadCmd("file", greeterProto, ""), StatusOK, ""},
		{"same file again", protoLoadCmd("file", greeterProto, ""), StatusOK, ""},
		{"by import name", protoLoadCmd("file", "greeter.proto", "import_path=../../demo/proto\n"), StatusOK, ""},
		{"missing", protoLoadCmd("file", "/nonexistent/x.proto", ""), ErrGeneric, "bad proto: /nonexistent/x.proto: file not found"},
		{"garbage set", protoLoadCmd("descriptor_set", "\xff\xff", ""), ErrGeneric, "bad proto: descriptor set: "},
		{"bad method", protoLoadCmd("url", "x", ""), ErrBadArg, `bad command: proto load: method must be "file" or "descriptor_set", got "url"`},
		{"bad option", protoLoadCmd("file", greeterProto, "include=/x\n"), ErrBadArg, "bad command: opts: unknown record key 65535"},
		{"import path on a set", protoLoadCmd("descriptor_set", "x", "import_path=/x\n"), ErrBadArg, "bad command: proto load: import_path is for files"},
		{"empty path", protoLoadCmd("file", "", ""), ErrBadArg, "bad command: proto load: empty path"},
	}
	for _, c := range cases {
		out, msg := r.Query(c.cmd)
		if out.Status != c.status || !strings.HasPrefix(msg, c.msg) {
			t.Errorf("%s: %d %q, want %d %q", c.name, out.Status, msg, c.status, c.msg)
		}
		r.Free(&out)
	}
	if _, err := schemas.Message("demo.AllKinds"); err != nil {
		t.Fatal(err)
	}
}

func loadGreeter(t *testing.T, r *Runtime) {
	t.Helper()
	out, msg := r.Query(protoLoadCmd("file", greeterProto, ""))
	if out.Status != StatusOK {
		t.Fatalf("load: %q", msg)
	}
	r.Free(&out)
}

func protoUnary(conn, id uint64, method, body, req, resp string, flags uint32) Command {
	c := unary(conn, id, method, body, 5000)
	c.ReqType, c.RespType, c.Flags = []byte(req), []byte(resp), flags
	return c
}

// Requests are encoded before they are sent, responses decoded when they
// arrive, through a real qrpc server that echoes bytes.
func TestProtoCalls(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	r := New(newGoMemory(t), nil)
	loadGreeter(t, r)
	h := newTestHost(t, r, true)
	conn := h.connect(1, ts)

	// JSON -> protobuf on the wire (the echo shows what was sent).
	h.submit(protoUnary(conn, 2, "echo", `{"name":"x"}`, "demo.HelloRequest", "", 0), StatusPending)
	_, _, body := result(t, h.wait(2, 5*time.Second))
	var req demopb.HelloRequest
	if err := proto.Unmarshal(body, &req); err != nil || req.Name != "x" {
		t.Fatalf("sent %x (%v)", body, err)
	}

	// Both ways; field names as in the .proto with the flag.
	in := `{"i64":"-5","byId":{"7":{"id":"s"}},"choiceText":"c"}`
	h.submit(protoUnary(conn, 3, "echo", in, "demo.AllKinds", "demo.AllKinds", 0), StatusPending)
	if _, _, body := result(t, h.wait(3, 5*time.Second)); string(body) != in {
		t.Fatalf("round trip: %s", body)
	}
	h.submit(protoUnary(conn, 4, "echo", in, "demo.AllKinds", "demo.AllKinds", FlagProtoNames), StatusPending)
	if _, _, body := result(t, h.wait(4, 5*time.Second)); string(body) != `{"i64":"-5","by_id":{"7":{"id":"s"}},"choice_text":"c"}` {
		t.Fatalf("proto names: %s", body)
	}

	// For Lua tables: a NUL byte, then the reply in LuaJIT's format, the
	// same value as the JSON.
	h.submit(protoUnary(conn, 13, "echo", in, "demo.AllKinds", "demo.AllKinds", FlagProtoNames|FlagLuaTable), StatusPending)
	_, _, body = result(t, h.wait(13, 5*time.Second))
	want, err := luaserial.FromJSON([]byte{0}, []byte(`{"i64":"-5","by_id":{"7":{"id":"s"}},"choice_text":"c"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, want) {
		t.Fatalf("Lua table reply: %x, want %x", body, want)
	}

	// A reply nested deeper than a Lua table holds (LuaJIT decodes 100
	// levels): a bad response with the answer as it came, for tables
	// only; one level less is a table.
	nested := func(levels int) string {
		s := `{"id":"x"}`
		for i := 2; i < levels; i++ {
			s = `{"child":` + s + `}`
		}
		return `{"inner":` + s + `}`
	}
	h.submit(protoUnary(conn, 15, "echo", nested(luaserial.MaxDepth), "demo.AllKinds", "demo.AllKinds", FlagProtoNames|FlagLuaTable), StatusPending)
	if c := h.wait(15, 5*time.Second); c.Status != StatusOK || Bytes(c.Data, int(c.Len))[0] != 0 {
		t.Fatalf("reply of %d levels: status %d", luaserial.MaxDepth, c.Status)
	}
	// (a JSON request that deep is refused: the reply's bytes are sent)
	deep := &demopb.AllKinds{}
	if err := protojson.Unmarshal([]byte(nested(luaserial.MaxDepth+1)), deep); err != nil {
		t.Fatal(err)
	}
	deepPB, err := proto.Marshal(deep)
	if err != nil {
		t.Fatal(err)
	}
	h.submit(protoUnary(conn, 16, "echo", string(deepPB), "", "demo.AllKinds", FlagProtoNames|FlagLuaTable), StatusPending)
	c := h.wait(16, 5*time.Second)
	if c.Status != StatusBadResponse {
		t.Fatalf("reply of %d levels: status %d %q", luaserial.MaxDepth+1, c.Status, text(c))
	}
	msg, _, _, raw, err := ParseBadResponse(Bytes(c.Data, int(c.Len)))
	wantMsg := "bad response: demo.AllKinds: nested more than 100 levels, more than a Lua table reply holds (json = true gives the JSON text)"
	if err != nil || msg != wantMsg || len(raw) == 0 {
		t.Fatalf("reply of %d levels: %q (%d bytes) %v", luaserial.MaxDepth+1, msg, len(raw), err)
	}
	h.submit(protoUnary(conn, 17, "echo", string(deepPB), "", "demo.AllKinds", 0), StatusPending)
	if _, _, body := result(t, h.wait(17, 5*time.Second)); string(body) != nested(luaserial.MaxDepth+1) {
		t.Fatalf("JSON reply of %d levels: %s", luaserial.MaxDepth+1, body)
	}

	// A Lua table in string.buffer's format (FlagLuaRequest): as its JSON.
	// { name = "lua" }, then { nmae = "x" }, { name = 5 }, { [true] = 1 },
	// and bytes no Lua wrote, as buffer.encode writes them.
	h.submit(protoUnary(conn, 14, "echo", "\x09\x01\x24name\x23lua", "demo.HelloRequest", "demo.HelloRequest", FlagLuaRequest), StatusPending)
	if _, _, body := result(t, h.wait(14, 5*time.Second)); string(body) != `{"name":"lua"}` {
		t.Fatalf("Lua table request: %s", body)
	}
	for i, c := range []struct{ ser, msg string }{
		{"\x09\x01\x24nmae\x21x", "bad message: demo.HelloRequest: nmae: unknown field"},
		{"\x09\x01\x24name\x07\x00\x00\x00\x00\x00\x00\x14\x40", "bad message: demo.HelloRequest: name: expected string, got number 5"},
		{"\x09\x01\x02\x07\x00\x00\x00\x00\x00\x00\xf0\x3f", "bad argument #3: body: table keys must be strings or integers (got boolean)"},
		{"\x09\x01\x24name", "bad message: demo.HelloRequest: malformed Lua table data at offset 7: unexpected end of data"},
	} {
		before, _ := r.Stats(conn, 0)
		if msg := h.submit(protoUnary(conn, uint64(20+i), "echo", c.ser, "demo.HelloRequest", "", FlagLuaRequest), ErrGeneric); msg != c.msg {
			t.Errorf("Lua table request %d: got %q, want %q", i, msg, c.msg)
		}
		if after, _ := r.Stats(conn, 0); after.Calls != before.Calls {
			t.Fatalf("Lua table request %d was sent", i)
		}
	}

	// Unknown fields: refused, or dropped with the flag.
	h.submit(protoUnary(conn, 5, "echo", `{"name":"x","extra":1}`, "demo.HelloRequest", "demo.HelloRequest", FlagDiscardUnknown), StatusPending)
	if _, _, body := result(t, h.wait(5, 5*time.Second)); string(body) != `{"name":"x"}` {
		t.Fatalf("discard unknown: %s", body)
	}

	// Bad requests fail at submit and send nothing.
	before, _ := r.Stats(conn, 0)
	for _, c := range []struct {
		cmd Command
		msg string
	}{
		{protoUnary(conn, 6, "echo", `{"name":"x","extra":1}`, "demo.HelloRequest", "", 0), "bad message: demo.HelloRequest: extra: unknown field"},
		{protoUnary(conn, 7, "echo", `{"name":5}`, "demo.HelloRequest", "", 0), "bad message: demo.HelloRequest: name: expected string, got number 5"},
		{protoUnary(conn, 8, "echo", `{"name":`, "demo.HelloRequest", "", 0), "bad message: demo.HelloRequest: invalid JSON at offset 8: unexpected end of JSON input"},
		{protoUnary(conn, 9, "echo", `{}`, "demo.Nope", "", 0), "bad message: demo.Nope: unknown message type"},
		{protoUnary(conn, 10, "echo", `{}`, "demo.HelloRequest", "demo.Nope", 0), "bad response: demo.Nope: unknown message type"},
	} {
		if msg := h.submit(c.cmd, ErrGeneric); msg != c.msg {
			t.Errorf("got %q, want %q", msg, c.msg)
		}
	}
	if after, _ := r.Stats(conn, 0); after.Calls != before.Calls {
		t.Fatalf("bad requests were sent: %d calls before, %d after", before.Calls, after.Calls)
	}

	// A response that is not the declared message: the reason and the
	// answer as it came.
	h.submit(protoUnary(conn, 11, "echo", "\xff", "", "demo.HelloReply", 0), StatusPending)
	c = h.wait(11, 5*time.Second)
	if c.Status != StatusBadResponse {
		t.Fatalf("bad response: status %d %q", c.Status, text(c))
	}
	msg, code, _, raw, err := ParseBadResponse(Bytes(c.Data, int(c.Len)))
	if err != nil || code != 0 || string(raw) != "\xff" || msg != "bad response: demo.HelloReply: cannot parse invalid wire-format data" {
		t.Fatalf("bad response: %q %d %q %v", msg, code, raw, err)
	}

	// A non-zero code's body is the service's, not the message: as it came.
	h.submit(protoUnary(conn, 12, "code", "{}", "demo.HelloRequest", "demo.HelloReply", 0), StatusPending)
	if code, _, body := result(t, h.wait(12, 5*time.Second)); code != 7 || string(body) != "seven" {
		t.Fatalf("code 7: %d %q", code, body)
	}
}

// Events: encoded before sending; a bad one is refused and not sent.
func TestProtoEvent(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	r := New(newGoMemory(t), nil)
	loadGreeter(t, r)
	h := newTestHost(t, r, true)
	conn := h.connect(1, ts)

	ev := func(body string) Command {
		return Command{Op: OpEvent, Conn: conn, Method: []byte("ev"), Body: []byte(body), ReqType: []byte("demo.HelloRequest")}
	}
	if msg := h.submit(ev(`{"nope":1}`), ErrGeneric); msg != "bad message: demo.HelloRequest: nope: unknown field" {
		t.Fatalf("bad event: %q", msg)
	}
	h.submit(ev(`{"name":"e"}`), StatusOK)
	testwait.Until(t, "the good event reaches the server", 5*time.Second, func() bool { return ts.Events("ev") >= 1 })
	// Only the good one arrived (a late bad one would make this 2): checked
	// after 3 more round trips on the connection, not after a while.
	for i := uint64(0); i < 3; i++ {
		h.submit(unary(conn, 20+i, "echo", "after", 5000), StatusPending)
		h.wait(20+i, 5*time.Second)
	}
	if n := ts.Events("ev"); n != 1 {
		t.Fatalf("server saw %d events, want 1", n)
	}
}

// The request path of a Lua table allocates no more than a JSON body's:
// the release closure only (the encoders' buffers are pooled).
func TestLuaRequestBodyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	r := New(newGoMemory(t), nil)
	loadGreeter(t, r)
	lua := protoUnary(1, 1, "echo", "\x09\x01\x24name\x23lua", "demo.HelloRequest", "", FlagLuaRequest)
	slow := protoUnary(1, 1, "echo", "\x09\x02\x24name\x23lua\x24nope\x02", "demo.HelloRequest", "", FlagLuaRequest|FlagDiscardUnknown)
	js := protoUnary(1, 1, "echo", `{"name":"lua"}`, "demo.HelloRequest", "", 0)
	for _, c := range []struct {
		name string
		cmd  Command
	}{{"direct", lua}, {"via JSON", slow}, {"JSON", js}} {
		n := testing.AllocsPerRun(200, func() {
			body, release, err := requestBody(&c.cmd)
			if err != nil || len(body) == 0 {
				t.Fatalf("%s: %v", c.name, err)
			}
			release()
		})
		if n > 1 {
			t.Errorf("%s: %.1f allocations per request body, want at most 1", c.name, n)
		}
	}
}

func TestProtoDescribeQuery(t *testing.T) {
	r := New(newGoMemory(t), nil)
	cmd := &Command{Op: OpProtoDescribe, Method: []byte("file"), Body: []byte("greeter_http.proto"),
		Opts: recs("import_path=../../demo/proto\n")}
	out, msg := r.Query(cmd)
	if out.Status != StatusOK {
		t.Fatalf("describe: %d %q", out.Status, msg)
	}
	js := string(Bytes(out.Data, int(out.Len)))
	r.Free(&out)
	for _, want := range []string{`"name":"demo.Greeter"`, `"method":"GET","path":"/v1/hello/{name}"`,
		`"method":"POST","path":"/v1/hello","body":"*"`, `"demo.HelloRequest":{`} {
		if !strings.Contains(js, want) {
			t.Errorf("describe: no %s in %s", want, js)
		}
	}
	// the file is loaded too: its messages are known to calls
	if _, err := schemas.Message("demo.HelloReply"); err != nil {
		t.Error(err)
	}
	for _, c := range []struct {
		cmd    *Command
		status int32
		msg    string
	}{
		{&Command{Op: OpProtoDescribe, Method: []byte("set"), Body: []byte("x")}, ErrBadArg, `bad command: proto describe: method must be "file"`},
		{&Command{Op: OpProtoDescribe, Method: []byte("file")}, ErrBadArg, "bad command: proto describe: empty path"},
		{&Command{Op: OpProtoDescribe, Method: []byte("file"), Body: []byte("/nonexistent/x.proto")}, ErrGeneric, "bad proto: /nonexistent/x.proto: file not found"},
	} {
		out, msg := r.Query(c.cmd)
		if out.Status != c.status || !strings.HasPrefix(msg, c.msg) {
			t.Errorf("%s: %d %q, want %d %q", c.cmd.Body, out.Status, msg, c.status, c.msg)
		}
		r.Free(&out)
	}
}

// Two fields with one JSON name (proto2 allows it): a Lua table cannot
// hold both keys, so with lowerCamelCase names the reply is a bad
// response; with .proto names (distinct) it is a table.
func TestProtoReplyDuplicateJSONName(t *testing.T) {
	ts := testsrv.Start(t, testsrv.Options{})
	r := New(newGoMemory(t), nil)
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	set, err := proto.Marshal(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{{
		Name: proto.String("dupjson.proto"), Package: proto.String("dupjson"), Syntax: proto.String("proto2"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("M"), Field: []*descriptorpb.FieldDescriptorProto{
			{Name: proto.String("foo_bar"), Number: proto.Int32(1), Type: str, Label: opt},
			{Name: proto.String("fooBar"), Number: proto.Int32(2), Type: str, Label: opt},
		}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	out, msg := r.Query(protoLoadCmd("descriptor_set", string(set), ""))
	if out.Status != StatusOK {
		t.Fatalf("load: %q", msg)
	}
	r.Free(&out)
	h := newTestHost(t, r, true)
	conn := h.connect(1, ts)
	wire := "\x0a\x01a\x12\x01b" // foo_bar = "a", fooBar = "b"

	h.submit(protoUnary(conn, 2, "echo", wire, "", "dupjson.M", FlagLuaTable), StatusPending)
	c := h.wait(2, 5*time.Second)
	if c.Status != StatusBadResponse {
		t.Fatalf("lowerCamelCase names: status %d %q", c.Status, text(c))
	}
	msg, _, _, raw, err := ParseBadResponse(Bytes(c.Data, int(c.Len)))
	want := "bad response: dupjson.M: two fields with one JSON name, which a Lua table reply cannot hold (proto_names = true or json = true gives both)"
	if err != nil || msg != want || string(raw) != wire {
		t.Fatalf("lowerCamelCase names: %q %q %v", msg, raw, err)
	}
	h.submit(protoUnary(conn, 3, "echo", wire, "", "dupjson.M", FlagLuaTable|FlagProtoNames), StatusPending)
	_, _, body := result(t, h.wait(3, 5*time.Second))
	if want, err := luaserial.FromJSON([]byte{0}, []byte(`{"foo_bar":"a","fooBar":"b"}`)); err != nil || !bytes.Equal(body, want) {
		t.Fatalf(".proto names: %x, want %x (%v)", body, want, err)
	}
}
