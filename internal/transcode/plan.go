package transcode

import (
	"encoding/json"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A plan is what the fast paths (fastdecode.go, fastencode.go) need to know
// about a message type, worked out once: protojson with dynamicpb goes
// through reflection and interfaces for every field of every call, which
// costs more than the 10 µs per call this package is allowed.
//
// The fast paths cover proto3 messages made of scalars, enums, nested
// messages, lists, maps, oneofs, Timestamp, Duration and the wrappers.
// The rest (Struct, Value, Any, FieldMask, proto2 and editions files) is
// handed to protojson one value at a time, and anything unusual in the
// input (a message field merged from two occurrences, a null, a number
// written as "1e3") sends the whole call to protojson, which then decides:
// the fast paths never accept what protojson would refuse, nor produce
// other bytes. FuzzDecode and FuzzEncode check that against protojson.
type plan struct {
	md     protoreflect.MessageDescriptor
	wkt    wktKind
	fields []*fieldPlan // in declaration order, protojson's output order
	byNum  map[protowire.Number]*fieldPlan
	// byName finds a field by JSON name or .proto name.
	byName  map[string]*fieldPlan
	oneofs  int  // real (not synthetic) oneofs
	ordered bool // declaration order is field number order
}

type wktKind int

const (
	wktNone      wktKind = iota
	wktTimestamp         // RFC 3339 string
	wktDuration          // "1.5s"
	wktWrapper           // the wrapped scalar
	wktOther             // handed to protojson
)

type fieldPlan struct {
	fd       protoreflect.FieldDescriptor
	idx      int
	num      protowire.Number
	kind     protoreflect.Kind
	list     bool
	isMap    bool
	packed   bool
	presence bool // written even when zero: oneof member or proto3 optional
	oneof    int  // index among the real oneofs, or -1
	// order is where the Go encoder (proto.Marshal, generated code and
	// dynamicpb alike) writes the field: by number, members of real oneofs
	// after the other fields, grouped by oneof.
	order int64
	// `"jsonName":` and `"proto_name":`, ready to append.
	camelKey, protoKey []byte
	msg                *plan // message kind, or the map's value type
	mapKey, mapVal     *fieldPlan
	nullValue          bool // enum google.protobuf.NullValue
}

// planFor returns the cached plan for md, building it (and the plans of
// the message types it refers to) on first use.
func (r *Registry) planFor(md protoreflect.MessageDescriptor) *plan {
	if p, ok := r.plans.Load(md.FullName()); ok {
		return p.(*plan)
	}
	built := map[protoreflect.FullName]*plan{}
	p := buildPlan(md, built)
	for name, bp := range built {
		r.plans.LoadOrStore(name, bp)
	}
	actual, _ := r.plans.LoadOrStore(md.FullName(), p)
	return actual.(*plan)
}

func buildPlan(md protoreflect.MessageDescriptor, built map[protoreflect.FullName]*plan) *plan {
	if p := built[md.FullName()]; p != nil {
		return p
	}
	p := &plan{md: md, wkt: wellKnownKind(md)}
	built[md.FullName()] = p
	if md.Syntax() != protoreflect.Proto3 && p.wkt == wktNone {
		p.wkt = wktOther
	}
	if p.wkt == wktOther {
		return p
	}
	fields := md.Fields()
	p.byNum = make(map[protowire.Number]*fieldPlan, fields.Len())
	p.byName = make(map[string]*fieldPlan, 2*fields.Len())
	p.ordered = true
	oneofIndex := map[protoreflect.FullName]int{}
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		fp := newFieldPlan(fd, i, built)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			n, ok := oneofIndex[od.FullName()]
			if !ok {
				n = len(oneofIndex)
				oneofIndex[od.FullName()] = n
			}
			fp.oneof = n
		}
		fp.order = int64(fp.num)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			fp.order += (1 << 40) + int64(od.Index())<<30
		}
		if i > 0 && fd.Number() < fields.Get(i-1).Number() {
			p.ordered = false
		}
		p.fields = append(p.fields, fp)
		p.byNum[fp.num] = fp
	}
	// protojson looks a key up by JSON name first, then by .proto name.
	for _, fp := range p.fields {
		p.byName[string(fp.fd.Name())] = fp
	}
	for _, fp := range p.fields {
		p.byName[fp.fd.JSONName()] = fp
	}
	p.oneofs = len(oneofIndex)
	return p
}

func newFieldPlan(fd protoreflect.FieldDescriptor, idx int, built map[protoreflect.FullName]*plan) *fieldPlan {
	fp := &fieldPlan{
		fd: fd, idx: idx, num: fd.Number(), kind: fd.Kind(),
		list: fd.IsList(), isMap: fd.IsMap(), packed: fd.IsPacked(),
		presence: fd.HasPresence() && fd.Kind() != protoreflect.MessageKind,
		oneof:    -1,
	}
	fp.camelKey = jsonKey(fd.JSONName())
	fp.protoKey = jsonKey(string(fd.Name()))
	switch {
	case fd.IsMap():
		fp.mapKey = newFieldPlan(fd.MapKey(), 0, built)
		fp.mapVal = newFieldPlan(fd.MapValue(), 1, built)
	case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
		fp.msg = buildPlan(fd.Message(), built)
	case fd.Kind() == protoreflect.EnumKind:
		fp.nullValue = fd.Enum().FullName() == "google.protobuf.NullValue"
	}
	return fp
}

func jsonKey(name string) []byte {
	b, _ := json.Marshal(name)
	return append(b, ':')
}

func wellKnownKind(md protoreflect.MessageDescriptor) wktKind {
	if !isWellKnown(md) {
		return wktNone
	}
	switch md.Name() {
	case "Timestamp":
		return wktTimestamp
	case "Duration":
		return wktDuration
	case "BoolValue", "Int32Value", "Int64Value", "UInt32Value", "UInt64Value",
		"FloatValue", "DoubleValue", "StringValue", "BytesValue":
		return wktWrapper
	}
	return wktOther
}

// wireType is the wire type a field of kind k is written with (unpacked).
func wireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	}
	return protowire.VarintType
}
