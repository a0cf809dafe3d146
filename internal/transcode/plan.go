package transcode

import (
	"cmp"
	"encoding/json"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
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
	// dense is byNum as a slice indexed by number, for the usual small
	// numbers: no hashing on the decode path.
	dense []*fieldPlan
	// names finds a field by JSON name or .proto name, without a Go map
	// (hashing the whole key and walking buckets showed in profiles of
	// the nginx worker).
	names   nameTable
	oneofs  int  // real (not synthetic) oneofs
	ordered bool // declaration order is field number order
	// Two fields with the same JSON name: protojson writes
	// both keys, which luaserial.FromJSON refuses, so the Lua form leaves
	// such a message to the JSON path.
	dupCamel bool
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
	// after the other fields, grouped by oneof. rank is the field's place
	// in that order among the message's fields, so that the encoder puts
	// fields back in order (Lua's pairs never gives it) without sorting.
	order int64
	rank  int
	// `"jsonName":` and `"proto_name":`, ready to append; and the same
	// names as Lua strings in string.buffer's format.
	camelKey, protoKey       []byte
	luaCamelKey, luaProtoKey []byte
	msg                      *plan // message kind, or the map's value type
	mapKey, mapVal           *fieldPlan
	nullValue                bool // enum google.protobuf.NullValue
	// enumByName and enumByNum are the enum's values, looked up without
	// going through the descriptor's maps and lazy initialisation.
	enumByName nameTable
	enumByNum  []string // by number when the numbers are small and >= 0
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
	// protojson looks a key up by JSON name first, then by .proto name;
	// the table keeps the first entry for a key.
	p.names = newNameTable(2 * len(p.fields))
	camel := map[string]bool{}
	for _, fp := range p.fields {
		p.dupCamel = p.dupCamel || camel[fp.fd.JSONName()]
		camel[fp.fd.JSONName()] = true
	}
	maxNum := 0
	for _, fp := range p.fields {
		p.names.add(fp.fd.JSONName(), fp, 0)
		maxNum = max(maxNum, int(fp.num))
	}
	for _, fp := range p.fields {
		p.names.add(string(fp.fd.Name()), fp, 0)
	}
	if maxNum < 256 {
		p.dense = make([]*fieldPlan, maxNum+1)
		for _, fp := range p.fields {
			p.dense[fp.num] = fp
		}
	}
	byOrder := slices.Clone(p.fields)
	slices.SortFunc(byOrder, func(a, b *fieldPlan) int { return cmp.Compare(a.order, b.order) })
	for i, fp := range byOrder {
		fp.rank = i
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
	fp.luaCamelKey = luaserial.AppendString(nil, fd.JSONName())
	fp.luaProtoKey = luaserial.AppendString(nil, string(fd.Name()))
	switch {
	case fd.IsMap():
		fp.mapKey = newFieldPlan(fd.MapKey(), 0, built)
		fp.mapVal = newFieldPlan(fd.MapValue(), 1, built)
	case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
		fp.msg = buildPlan(fd.Message(), built)
	case fd.Kind() == protoreflect.EnumKind:
		fp.nullValue = fd.Enum().FullName() == "google.protobuf.NullValue"
		values := fd.Enum().Values()
		fp.enumByName = newNameTable(values.Len())
		dense := true
		for i := 0; i < values.Len(); i++ {
			v := values.Get(i)
			fp.enumByName.add(string(v.Name()), nil, int32(v.Number()))
			dense = dense && v.Number() >= 0 && v.Number() < 256
		}
		if dense {
			for i := 0; i < values.Len(); i++ {
				v := values.Get(i)
				for len(fp.enumByNum) <= int(v.Number()) {
					fp.enumByNum = append(fp.enumByNum, "")
				}
				// The first value with a number names it, as
				// EnumValueDescriptors.ByNumber does for aliases.
				if fp.enumByNum[v.Number()] == "" {
					fp.enumByNum[v.Number()] = string(v.Name())
				}
			}
		}
	}
	return fp
}

// dupLuaKey reports whether the message's table would have a key twice.
// (.proto names are unique within a message; JSON names need not be in a
// descriptor set that was not compiled from source.)
func (p *plan) dupLuaKey(protoNames bool) bool {
	return !protoNames && p.dupCamel
}

// byNumber is byNum through the dense slice when it can.
func (p *plan) byNumber(num protowire.Number) *fieldPlan {
	if uint64(num) < uint64(len(p.dense)) {
		return p.dense[num]
	}
	return p.byNum[num]
}

// nameTable is a small open-addressing hash table from names to fields
// (or enum numbers), built once per message type and read without locks.
// Its hash reads three bytes and the length, not the whole key: the keys
// of one message differ early or in length, and a collision costs one
// more string compare.
type nameTable struct {
	slots []nameSlot
	mask  uint32
}

type nameSlot struct {
	key string // "" marks a free slot: no field or enum value has an empty name
	f   *fieldPlan
	v   int32
}

func newNameTable(n int) nameTable {
	size := 4
	for size < 2*n {
		size *= 2
	}
	return nameTable{slots: make([]nameSlot, size), mask: uint32(size - 1)}
}

func nameHash[S string | []byte](s S) uint32 {
	n := len(s)
	if n == 0 {
		return 0
	}
	h := uint32(n)*0x9e3779b1 ^ uint32(s[0])*0x85ebca6b ^ uint32(s[n-1])*0xc2b2ae35 ^ uint32(s[n/2])*0x27d4eb2f
	return h ^ h>>15
}

// add inserts key unless it is there already (the first entry wins).
func (t *nameTable) add(key string, f *fieldPlan, v int32) {
	for i := nameHash(key) & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.key == key {
			return
		}
		if s.key == "" {
			*s = nameSlot{key: key, f: f, v: v}
			return
		}
	}
}

// find returns the slot for key, or nil. The table is never full (it has
// twice the room it needs), so the probe ends at a free slot.
func (t *nameTable) find(key []byte) *nameSlot {
	if len(t.slots) == 0 || len(key) == 0 {
		return nil
	}
	for i := nameHash(key) & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.key == string(key) {
			return s
		}
		if s.key == "" {
			return nil
		}
	}
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
