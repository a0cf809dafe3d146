package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/transcode"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Protobuf messages from JSON: QRPC_OP_PROTO_LOAD fills the
// worker's schema registry; UNARY and EVENT with req_type send the JSON
// body encoded as that message, and UNARY with resp_type answers with the
// response body decoded to JSON.

// FlagProtoNames is QRPC_F_PROTO_NAMES: resp_type's JSON names fields as
// the .proto file does (user_name) rather than in lowerCamelCase
// (userName). The Lua module sets it for Lua tables.
const FlagProtoNames = 2

// FlagLuaTable is QRPC_F_LUA_TABLE: resp_type's reply is a NUL byte then
// the value in LuaJIT's string.buffer serialization format, rather than
// JSON text, so that Lua builds its table with one buffer decode (a C call
// that sizes every table once) instead of parsing JSON on the nginx
// thread. A reply the format cannot hold (nesting deeper than LuaJIT
// decodes, two fields with one JSON name) is a StatusBadResponse.
const FlagLuaTable = 4

// FlagLuaRequest is QRPC_F_LUA_REQUEST: req_type's body is a Lua table in
// LuaJIT's string.buffer serialization format (buffer.encode, one C call
// on the nginx thread) rather than JSON text. EncodeLua reads ordinary
// tables straight to protobuf; the rest (maps, well-known types, unknown
// fields, discard_unknown, a value that does not match) goes through the
// JSON text luaserial.ToJSON writes, which protojson's mapping and error
// diagnosis read.
const FlagLuaRequest = 8

// FlagEmitUnpopulated is QRPC_F_EMIT_UNPOPULATED: resp_type's answer
// shows the fields that hold their zero value (what grpc-gateway's
// EmitUnpopulated gives its clients).
const FlagEmitUnpopulated = 16

// StatusBadResponse is QRPC_BAD_RESPONSE: a UNARY with resp_type whose
// answer did not decode. It is not an error of the call (the server
// answered), so Lua gets both the reason and the raw answer: the data is
// [u32 msg_len][msg][result blob with the undecoded body].
const StatusBadResponse = 3

// schemas is the process's (= nginx worker's) registry: loads add to it,
// every connection's calls read it.
var schemas = transcode.NewRegistry()

func init() {
	RegisterQuery(OpProtoLoad, protoLoad)
	RegisterQuery(OpProtoDescribe, protoDescribe)
}

// protoDescribe answers QRPC_OP_PROTO_DESCRIBE: the file (body: its path;
// opts: "import_path=DIR" lines, as for a load) is loaded if it is not
// yet, and described as JSON text (transcode.Schema): its services, their
// methods' google.api.http rules, and the messages and enums they reach.
func protoDescribe(_ *Runtime, cmd *Command) ([]byte, error) {
	importPaths, err := importPaths(cmd.Opts, "proto describe")
	if err != nil {
		return nil, err
	}
	if string(cmd.Method) != "file" {
		return nil, Badf("proto describe: method must be \"file\", got %q", cmd.Method)
	}
	if len(cmd.Body) == 0 {
		return nil, Badf("proto describe: empty path")
	}
	return schemas.Describe(string(cmd.Body), importPaths)
}

// importPaths reads IMPORT_PATH records.
func importPaths(opts []byte, what string) ([]string, error) {
	var dirs []string
	err := eachRec(opts, func(r Rec) error {
		if r.Key != KeyImportPath || len(r.Val) == 0 {
			return Badf("%s: record %d is not an import path", what, r.Key)
		}
		dirs = append(dirs, r.Str())
		return nil
	})
	return dirs, err
}

// protoLoad answers QRPC_OP_PROTO_LOAD: method "file" (body: the path) or
// "descriptor_set" (body: the bytes); opts: "import_path=DIR" lines.
func protoLoad(_ *Runtime, cmd *Command) ([]byte, error) {
	importPaths, err := importPaths(cmd.Opts, "proto load")
	if err != nil {
		return nil, err
	}
	switch string(cmd.Method) {
	case "file":
		if len(cmd.Body) == 0 {
			return nil, Badf("proto load: empty path")
		}
		return nil, schemas.LoadFile(string(cmd.Body), importPaths)
	case "descriptor_set":
		if len(importPaths) > 0 {
			return nil, Badf("proto load: import_path is for files, not descriptor sets")
		}
		return nil, schemas.LoadDescriptorSet(cmd.Body)
	}
	return nil, Badf("proto load: method must be \"file\" or \"descriptor_set\", got %q", cmd.Method)
}

// messageCache maps type names to messages without converting the name to
// a string on every call (a map index with string(b) does not allocate).
// Readers load an immutable map snapshot (no lock on the call path);
// writers copy it, add the new entry and swap it in under messageMu.
var (
	messageCache atomic.Pointer[map[string]*transcode.Message]
	messageMu    sync.Mutex
)

func message(name []byte) (*transcode.Message, error) {
	if cur := messageCache.Load(); cur != nil {
		if m := (*cur)[string(name)]; m != nil {
			return m, nil
		}
	}
	m, err := schemas.Message(string(name))
	if err != nil {
		return nil, err
	}
	messageMu.Lock()
	defer messageMu.Unlock()
	next := map[string]*transcode.Message{}
	if cur := messageCache.Load(); cur != nil {
		for k, v := range *cur {
			next[k] = v
		}
	}
	next[string(name)] = m
	messageCache.Store(&next)
	return m, nil
}

// bodyPool recycles the buffers encoded request bodies are built in: the
// frame is encoded (copied) before Start or Event returns.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func noRelease() {}

// requestBody is the body to send for cmd: cmd.Body itself, or with
// req_type its protobuf encoding, in a pooled buffer that release returns.
// A body that does not match the message is refused here, before
// anything is sent.
func requestBody(cmd *Command) (body []byte, release func(), err error) {
	if len(cmd.ReqType) == 0 {
		return cmd.Body, noRelease, nil
	}
	m, err := message(cmd.ReqType)
	if err != nil {
		return nil, noRelease, err
	}
	in := cmd.Body
	discard := cmd.Flags&FlagDiscardUnknown != 0
	if cmd.Flags&FlagLuaRequest != 0 {
		// Straight from the table's bytes when it is an ordinary one
		// (EncodeLua leaves unknown fields, and so discard_unknown, to the
		// JSON path); else through the JSON text, which also finds the
		// errors.
		if !discard {
			bp := bodyPool.Get().(*[]byte)
			if out, ok := m.EncodeLua((*bp)[:0], cmd.Body); ok {
				*bp = out
				return out, func() { putBody(bp) }, nil
			}
			bodyPool.Put(bp)
		}
		jp := bodyPool.Get().(*[]byte)
		defer putBody(jp)
		js, marks, err := luaserial.ToJSONMarked((*jp)[:0], cmd.Body, nil)
		if err != nil {
			var ve *luaserial.ValueError
			if errors.As(err, &ve) {
				// a table no message can be read from, in the Lua module's words
				return nil, noRelease, errors.New("bad argument #3: body: " + ve.What)
			}
			return nil, noRelease, &transcode.MessageError{Message: m.Name(), What: err.Error()}
		}
		*jp = js
		// NaN, inf and 64-bit cdata, written as strings, are no strings
		// in a Struct or Value
		if in, err = m.CheckLuaMarks(js, marks); err != nil {
			return nil, noRelease, err
		}
	}
	bp := bodyPool.Get().(*[]byte)
	out, err := m.Encode((*bp)[:0], in, transcode.EncodeOptions{DiscardUnknown: discard})
	if err != nil {
		bodyPool.Put(bp)
		return nil, noRelease, err
	}
	*bp = out
	return out, func() { putBody(bp) }, nil
}

// responseType resolves resp_type on the submit path, so that an unknown
// name fails the call before it is sent. nil: no decoding.
type responseType struct {
	m    *transcode.Message
	opts transcode.DecodeOptions
	lua  bool // FlagLuaTable
}

func responseTypeOf(cmd *Command) (*responseType, error) {
	if len(cmd.RespType) == 0 {
		return nil, nil
	}
	m, err := message(cmd.RespType)
	if err != nil {
		if me, ok := err.(*transcode.MessageError); ok {
			me.Response = true
		}
		return nil, err
	}
	return &responseType{m: m, opts: transcode.DecodeOptions{ProtoNames: cmd.Flags&FlagProtoNames != 0,
		EmitDefaults: cmd.Flags&FlagEmitUnpopulated != 0},
		lua: cmd.Flags&FlagLuaTable != 0}, nil
}

// decodedOutcome is outcome for a call with resp_type. A non-zero code is
// the application's error, whose body is not the reply message: it is
// passed on as it came.
func (r *Runtime) decodedOutcome(rt *responseType, resp *qrpc.Response, err error) (out Completion) {
	if err != nil || resp.Code != 0 {
		return r.outcome(resp, err)
	}
	defer safego.Recover("complete", func() {
		out = r.Message(ErrGeneric, "internal error", 0)
	})
	if rt.lua {
		// Straight from the wire data to the table's bytes; what the
		// direct path leaves goes the JSON way below.
		sp := bodyPool.Get().(*[]byte)
		defer putBody(sp)
		if ser, ok := rt.m.DecodeLua(append((*sp)[:0], 0), resp.Body, rt.opts); ok {
			*sp = ser
			return r.Result(resp.Code, resp.Headers, ser)
		}
	}
	bp := bodyPool.Get().(*[]byte)
	defer putBody(bp)
	js, derr := rt.m.Decode((*bp)[:0], resp.Body, rt.opts)
	if derr != nil {
		return r.badResponse(derr.Error(), resp)
	}
	*bp = js
	if rt.lua {
		sp := bodyPool.Get().(*[]byte)
		defer putBody(sp)
		ser, err := luaserial.FromJSON(append((*sp)[:0], 0), js)
		if err != nil {
			return r.badResponse(luaTableError(rt.m.Name(), err), resp)
		}
		*sp = ser
		return r.Result(resp.Code, resp.Headers, ser)
	}
	return r.Result(resp.Code, resp.Headers, js)
}

// luaTableError is the bad response of a decoded reply that a Lua table
// cannot hold: LuaJIT's decoder refuses more than luaserial.MaxDepth
// levels and a key twice in one table. The words are in docs/protobuf.md.
func luaTableError(msg string, err error) string {
	what := "cannot be a Lua table: " + err.Error()
	switch {
	case errors.Is(err, luaserial.ErrTooDeep):
		what = fmt.Sprintf("nested more than %d levels, more than a Lua table reply holds (json = true gives the JSON text)", luaserial.MaxDepth)
	case errors.Is(err, luaserial.ErrDuplicateKey):
		what = "two fields with one JSON name, which a Lua table reply cannot hold (proto_names = true or json = true gives both)"
	}
	return (&transcode.MessageError{Response: true, Message: msg, What: what}).Error()
}

// putBody returns a buffer of bodyPool, unless a huge message grew it.
func putBody(bp *[]byte) {
	if cap(*bp) <= 64<<10 {
		*bp = (*bp)[:0]
		bodyPool.Put(bp)
	}
}

// badResponse is the StatusBadResponse completion: the reason, then the
// answer as it came.
func (r *Runtime) badResponse(msg string, resp *qrpc.Response) Completion {
	msg = Clip(msg)
	n := 4 + len(msg) + ResultSize(resp.Headers, resp.Body)
	p := r.mem.Alloc(n)
	if p == nil {
		return r.Message(ErrGeneric, "out of memory", 0)
	}
	b := Bytes(p, n)
	binary.NativeEndian.PutUint32(b, uint32(len(msg)))
	copy(b[4:], msg)
	WriteResult(b[4+len(msg):], resp.Code, resp.Headers, resp.Body)
	return Completion{Status: StatusBadResponse, Data: p, Len: uintptr(n)}
}

// ParseBadResponse splits a StatusBadResponse completion's data.
func ParseBadResponse(b []byte) (msg string, code uint32, hdrs [][]byte, body []byte, err error) {
	if len(b) < 4 {
		return "", 0, nil, nil, fmt.Errorf("bad response data of %d bytes", len(b))
	}
	n := binary.NativeEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return "", 0, nil, nil, fmt.Errorf("bad response message of %d bytes in %d", n, len(b))
	}
	msg = string(b[4 : 4+n])
	code, hdrs, body, err = ParseResult(b[4+n:])
	return msg, code, hdrs, body, err
}
