package transcode

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

// Message is one message type of a Registry, ready to transcode. Get it
// from Registry.Message and keep it: it holds everything a call needs.
type Message struct {
	reg  *Registry
	desc protoreflect.MessageDescriptor
	typ  protoreflect.MessageType
	plan *plan
	// masks: the type can hold a FieldMask, which a request may give in
	// its message form (fieldmask.go)
	masks bool
}

// Name is the message's full name.
func (m *Message) Name() string { return string(m.desc.FullName()) }

// Descriptor is the message's descriptor.
func (m *Message) Descriptor() protoreflect.MessageDescriptor { return m.desc }

// EncodeOptions tune Encode.
type EncodeOptions struct {
	// DiscardUnknown ignores JSON fields the message does not have instead
	// of failing.
	DiscardUnknown bool
}

// DecodeOptions tune Decode.
type DecodeOptions struct {
	// ProtoNames names fields as in the .proto file (user_name) instead of
	// the proto3 JSON mapping's lowerCamelCase (userName).
	ProtoNames bool
	// EmitDefaults writes fields that hold their default value (0, "",
	// false, empty lists and maps) instead of leaving them out.
	EmitDefaults bool
}

// MessageError is a request that does not match its message type ("bad
// message: ...") or a response that does not parse as its type ("bad
// response: ...").
type MessageError struct {
	Response bool   // a response being decoded, not a request being encoded
	Message  string // full name of the message type
	// Path locates the offending field in the JSON input, in the names the
	// input used: inner.items[2].id, labels["k"]. Empty when the error is
	// not about one field (invalid JSON, unknown message type).
	Path string
	What string
}

func (e *MessageError) Error() string {
	var b strings.Builder
	if e.Response {
		b.WriteString("bad response: ")
	} else {
		b.WriteString("bad message: ")
	}
	b.WriteString(e.Message)
	if e.Path != "" {
		b.WriteString(": ")
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	b.WriteString(e.What)
	return b.String()
}

// Encode appends to dst the protobuf encoding of js, a JSON object in the
// proto3 JSON mapping. Map entries are written in key order, so equal
// input gives equal bytes.
func (m *Message) Encode(dst, js []byte, o EncodeOptions) ([]byte, error) {
	fe := fastEncoder{reg: m.reg, discard: o.DiscardUnknown, in: js}
	if out, ok := fe.encode(dst, m.plan); ok {
		return out, nil
	}
	return m.encodeSlow(dst, js, o)
}

// encodeSlow is Encode by protojson and dynamicpb: for what the fast path
// leaves alone, and for the errors.
func (m *Message) encodeSlow(dst, js []byte, o EncodeOptions) ([]byte, error) {
	if tooDeep(js) {
		return dst, &MessageError{Message: m.Name(), What: errTooDeep}
	}
	var lifts []maskLift
	if m.masks {
		js, lifts = liftFieldMasks(m.desc, js)
	}
	msg := m.typ.New().Interface()
	types := m.reg.resolver()
	uo := protojson.UnmarshalOptions{DiscardUnknown: o.DiscardUnknown, Resolver: types}
	if err := uo.Unmarshal(js, msg); err != nil {
		return dst, m.requestError(js, o, err)
	}
	for _, l := range lifts {
		if !l.apply(msg.ProtoReflect()) {
			// protojson read the text, so each mask's place exists
			return dst, &MessageError{Message: m.Name(), What: "internal error: a FieldMask in message form out of place"}
		}
	}
	out, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(dst, msg)
	if err != nil {
		// Only a message that breaks proto's own rules gets here (a
		// required field of a proto2 message left out).
		return dst, &MessageError{Message: m.Name(), What: cleanProtoError(err)}
	}
	return out, nil
}

// maxRequestDepth is the most objects and arrays a JSON request may nest,
// the outermost included: the Lua table's limit (LuaJIT's string.buffer
// refuses more, and a table reply cannot hold more), so that a request
// is accepted or refused alike as a table and as JSON, and its echo fits
// in a table reply. protojson alone would allow 10000 levels, at a cost
// in Go stack and protojson's recursion that one request should not
// impose on the worker; real messages nest far less than 100.
const maxRequestDepth = luaserial.MaxDepth

var errTooDeep = fmt.Sprintf("nested too deep (more than %d levels)", maxRequestDepth)

// tooDeep tells whether the JSON text js nests more than maxRequestDepth
// objects and arrays, counting brackets outside strings (whether js is
// valid is protojson's to say).
func tooDeep(js []byte) bool {
	depth := 0
	for i := 0; i < len(js); i++ {
		switch js[i] {
		case '"':
			for i++; i < len(js) && js[i] != '"'; i++ {
				if js[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			if depth++; depth > maxRequestDepth {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
}

// Decode appends to dst the JSON form of pb, the protobuf encoding of a
// message of this type. Fields pb has but the type does not know are left
// out.
func (m *Message) Decode(dst, pb []byte, o DecodeOptions) ([]byte, error) {
	fd := fastDecoder{reg: m.reg, protoNames: o.ProtoNames, emit: o.EmitDefaults}
	if res, ok := fd.message(dst, m.plan, pb); ok {
		return res, nil
	}
	return m.decodeSlow(dst, pb, o)
}

// decodeSlow is Decode by protojson and dynamicpb: for what the fast path
// leaves alone, and for the errors.
func (m *Message) decodeSlow(dst, pb []byte, o DecodeOptions) (out []byte, err error) {
	// google.golang.org/protobuf v1.36 panics on some malformed map
	// entries when it decodes into a dynamic message (a key with the wrong
	// wire type: "cannot convert nil to map key"); the bytes come from the
	// network, and a panic here would take the nginx worker down.
	defer func() {
		if p := recover(); p != nil {
			out, err = dst, &MessageError{Response: true, Message: m.Name(), What: fmt.Sprintf("cannot parse invalid wire-format data (%v)", p)}
		}
	}()
	msg := m.typ.New().Interface()
	types := m.reg.resolver()
	if err := (proto.UnmarshalOptions{Resolver: types}).Unmarshal(pb, msg); err != nil {
		return dst, &MessageError{Response: true, Message: m.Name(), What: cleanProtoError(err)}
	}
	mo := protojson.MarshalOptions{UseProtoNames: o.ProtoNames, EmitUnpopulated: o.EmitDefaults, Resolver: types}
	start := len(dst)
	out, err = mo.MarshalAppend(dst, msg)
	if err != nil {
		// Valid wire data that has no JSON form: a Timestamp out of
		// range, an Any whose type is unknown, invalid UTF-8 in a
		// proto2 string.
		return dst, &MessageError{Response: true, Message: m.Name(), What: cleanProtoError(err)}
	}
	if jsonSpacing {
		out = append(out[:start], compactJSON(out[start:])...)
	}
	return out, nil
}

// Encode is Message(name) then Encode.
func (r *Registry) Encode(name string, dst, js []byte, o EncodeOptions) ([]byte, error) {
	m, err := r.Message(name)
	if err != nil {
		return dst, err
	}
	return m.Encode(dst, js, o)
}

// Decode is Message(name) then Decode; an unknown name is a bad response.
func (r *Registry) Decode(name string, dst, pb []byte, o DecodeOptions) ([]byte, error) {
	m, err := r.Message(name)
	if err != nil {
		if me, ok := err.(*MessageError); ok {
			me.Response = true
		}
		return dst, err
	}
	return m.Decode(dst, pb, o)
}

// linePos is protojson's position in its input, " (line 1:7)" or
// "(line 1:7): ".
var linePos = regexp.MustCompile(`\s?\(line \d+:\d+\)(: )?`)

// jsonSpacing tells whether protojson puts random spaces in single-line
// output in this binary (it does in some builds, on purpose, so that
// nobody relies on its exact bytes). Gateway users see our output, and
// stable bytes are friendlier to them and to caches.
var jsonSpacing = func() bool {
	// A comma is where the space goes: a Struct with two fields has one.
	probe, err := protojson.Marshal(&structpb.Struct{Fields: map[string]*structpb.Value{
		"a": structpb.NewBoolValue(true),
		"b": structpb.NewBoolValue(true),
	}})
	return err != nil || bytes.ContainsAny(probe, " \n")
}()

// compactJSON removes the whitespace outside strings from protojson's
// single-line output, in place.
func compactJSON(b []byte) []byte {
	out := b[:0]
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case inString:
			if escaped {
				escaped = false
			} else if c == '\\' {
				escaped = true
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\n' || c == '\t' || c == '\r':
			continue
		}
		out = append(out, c)
	}
	return out
}

// cleanProtoError drops the "proto: " prefix and protojson's position, which
// locate the error in a JSON text the user may never have seen (a Lua
// table encoded for them).
func cleanProtoError(err error) string {
	s := strings.TrimPrefix(err.Error(), "proto: ")
	s = strings.TrimPrefix(s, "proto:\u00a0") // some builds use a non-breaking space
	return linePos.ReplaceAllString(s, "")
}
