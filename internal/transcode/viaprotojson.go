package transcode

import (
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

// The fast paths hand a value of a type they leave alone (Struct, Value,
// Any, FieldMask, proto2 messages) to protojson and dynamicpb, one value
// at a time, and go on with the rest of the message.

// viaProtojson encodes one value of a type the fast path leaves to
// protojson (Struct, Any, ...).
func (e *fastEncoder) viaProtojson(out []byte, md protoreflect.MessageDescriptor) ([]byte, bool) {
	start := e.pos
	e.ws()
	if !e.skip(e.depth) {
		return out, false
	}
	types := e.reg.resolver()
	msg := dynamicpb.NewMessage(md)
	if err := (protojson.UnmarshalOptions{DiscardUnknown: e.discard, Resolver: types}).Unmarshal(e.in[start:e.pos], msg); err != nil {
		return out, false
	}
	out, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(out, msg)
	return out, err == nil
}

// viaProtojson decodes one value of a type the fast path leaves to
// protojson (Struct, Any, ...).
func (d *fastDecoder) viaProtojson(out []byte, md protoreflect.MessageDescriptor, b []byte) (res []byte, ok bool) {
	defer func() {
		if recover() != nil { // see Message.Decode
			res, ok = out, false
		}
	}()
	types := d.reg.resolver()
	msg := dynamicpb.NewMessage(md)
	if err := (proto.UnmarshalOptions{Resolver: types}).Unmarshal(b, msg); err != nil {
		return out, false
	}
	dst := out
	if d.lua {
		dst = nil // the text is converted into out
	}
	start := len(dst)
	js, err := protojson.MarshalOptions{UseProtoNames: d.protoNames, EmitUnpopulated: d.emit, Resolver: types}.MarshalAppend(dst, msg)
	if err != nil {
		return out, false
	}
	if jsonSpacing {
		js = append(js[:start], compactJSON(js[start:])...)
	}
	if d.lua {
		if out, err = luaserial.AppendJSON(out, js, d.depth); err != nil {
			return out, false
		}
		return out, true
	}
	return js, true
}
