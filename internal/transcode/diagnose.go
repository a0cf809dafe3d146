package transcode

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// requestError explains why protojson refused js. protojson's errors name
// a field but not where it sits ("invalid value for int32 field id" says
// nothing about which of twenty items it was), so this walks the input
// along the schema to find the first offending value and give its path.
// Each value is judged by protojson itself, one field at a time, so the
// walk cannot accept what protojson refused or the other way round; only
// the wording of "what" is ours. This runs on failures only: the success
// path pays nothing for it.
func (m *Message) requestError(js []byte, o EncodeOptions, perr error) error {
	d := diagnoser{discard: o.DiscardUnknown, types: m.reg.resolver()}
	if path, what, found := d.diagnose(m.desc, js); found {
		return &MessageError{Message: m.Name(), Path: path, What: what}
	}
	// The walk found every piece acceptable alone: report protojson's own
	// words rather than nothing.
	return &MessageError{Message: m.Name(), What: cleanProtoError(perr)}
}

type diagnoser struct {
	discard bool
	types   *dynamicpb.Types
}

func (d *diagnoser) diagnose(md protoreflect.MessageDescriptor, js []byte) (path, what string, found bool) {
	if len(bytes.TrimSpace(js)) == 0 {
		return "", "invalid JSON: empty input", true
	}
	if !json.Valid(js) {
		var v any
		err := json.Unmarshal(js, &v)
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return "", fmt.Sprintf("invalid JSON at offset %d: %s", se.Offset, se.Error()), true
		}
		return "", "invalid JSON", true
	}
	if !utf8.Valid(js) {
		// encoding/json accepts invalid UTF-8 in strings; protojson and
		// proto3 do not. The walk below finds string fields; this catches
		// keys and the rest.
		defer func() {
			if !found {
				path, what, found = "", "invalid UTF-8 in JSON input", true
			}
		}()
	}
	if isWellKnown(md) {
		return d.leafMessage(md, js, "")
	}
	if jsonKind(js) != "object" {
		return "", "expected object, got " + jsonKind(js), true
	}
	return d.object(md, js, "")
}

// members calls f with each key (an object's) or index (an array's) and
// value of the JSON object or array js, the value a slice of js: a walk
// copies nothing, so that a deep request costs its failure no more than
// depth × size scanned (the depth is bounded: maxRequestDepth). f returns
// true to stop. ok is false when js is no object or array (js was found
// valid JSON first: not expected).
func members(js []byte, f func(key string, idx int, v []byte) bool) (stopped, ok bool) {
	l := lifter{js: js}
	end := l.each(l.ws(0), func(key string, idx, at int) int {
		vend := l.skip(at)
		if vend < 0 {
			return -1
		}
		if f(key, idx, js[at:vend]) {
			stopped = true
			return -1
		}
		return vend
	})
	return stopped, stopped || end >= 0
}

// object walks a JSON object that must be a message of type md.
func (d *diagnoser) object(md protoreflect.MessageDescriptor, js []byte, path string) (rp, rw string, bad bool) {
	seen := map[protoreflect.FieldNumber]bool{}
	oneofs := map[protoreflect.FullName]string{}
	fields := md.Fields()
	stopped, ok := members(js, func(key string, _ int, raw []byte) bool {
		fpath := joinPath(path, key)
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd == nil {
			if strings.HasPrefix(key, "[") || d.discard {
				// An extension ("[pkg.ext]") is protojson's to judge; it
				// is checked with the message it extends, below.
				if strings.HasPrefix(key, "[") {
					rp, rw, bad = d.leaf(md, nil, key, raw, fpath)
				}
				return bad
			}
			rp, rw, bad = fpath, "unknown field", true
			return true
		}
		if seen[fd.Number()] {
			rp, rw, bad = fpath, "duplicate field", true
			return true
		}
		seen[fd.Number()] = true
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			if other, ok := oneofs[od.FullName()]; ok {
				rp, rw, bad = fpath, fmt.Sprintf("oneof %s is already set by %s", od.Name(), other), true
				return true
			}
			oneofs[od.FullName()] = key
		}
		rp, rw, bad = d.field(md, fd, key, raw, fpath)
		return bad
	})
	if !stopped && !ok {
		return path, "invalid JSON", true
	}
	return rp, rw, bad
}

// field judges the value of one field of md.
func (d *diagnoser) field(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, key string, raw []byte, path string) (string, string, bool) {
	kind := jsonKind(raw)
	switch {
	case fd.IsMap():
		if kind == "null" {
			return d.leaf(md, fd, key, raw, path)
		}
		if kind != "object" {
			return path, "expected object (map), got " + kind, true
		}
		return d.mapEntries(md, fd, key, raw, path)
	case fd.IsList():
		if kind == "null" {
			return d.leaf(md, fd, key, raw, path)
		}
		if kind != "array" {
			return path, "expected array, got " + kind, true
		}
		return d.listElems(md, fd, key, raw, path)
	case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
		if isWellKnown(fd.Message()) || kind == "null" {
			return d.leaf(md, fd, key, raw, path)
		}
		if kind != "object" {
			return path, "expected object (" + string(fd.Message().FullName()) + "), got " + kind, true
		}
		return d.object(fd.Message(), raw, path)
	default:
		return d.leaf(md, fd, key, raw, path)
	}
}

func (d *diagnoser) listElems(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, key string, raw []byte, path string) (rp, rw string, bad bool) {
	isMsg := fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind
	stopped, ok := members(raw, func(_ string, i int, e []byte) bool {
		epath := fmt.Sprintf("%s[%d]", path, i)
		if isMsg && !isWellKnown(fd.Message()) && jsonKind(e) == "object" {
			rp, rw, bad = d.object(fd.Message(), e, epath)
			return bad
		}
		if msg, ok := d.try(md, key, concat("[", e, "]")); !ok {
			rp, rw, bad = epath, d.what(fd, e, msg), true
		}
		return bad
	})
	if !stopped && !ok {
		return path, "invalid JSON", true
	}
	return rp, rw, bad
}

func (d *diagnoser) mapEntries(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, key string, raw []byte, path string) (rp, rw string, bad bool) {
	seen := map[string]bool{}
	val := fd.MapValue()
	valIsMsg := val.Kind() == protoreflect.MessageKind && !isWellKnown(val.Message())
	stopped, ok := members(raw, func(k string, _ int, v []byte) bool {
		epath := path + "[" + strconv.Quote(k) + "]"
		qk, _ := json.Marshal(k)
		// The key alone, with a value the value type surely accepts.
		if msg, ok := d.try(md, key, concat("{", qk, ":", goodValue(val), "}")); !ok {
			rp, rw, bad = epath, "invalid map key: "+d.what(fd.MapKey(), qk, msg), true
			return true
		}
		if seen[k] {
			rp, rw, bad = epath, "duplicate map key", true
			return true
		}
		seen[k] = true
		if valIsMsg && jsonKind(v) == "object" {
			rp, rw, bad = d.object(val.Message(), v, epath)
			return bad
		}
		if msg, ok := d.try(md, key, concat("{", qk, ":", v, "}")); !ok {
			if jsonKind(v) == "null" {
				rp, rw, bad = epath, "null is not a valid map value", true
			} else {
				rp, rw, bad = epath, d.what(val, v, msg), true
			}
		}
		return bad
	})
	if !stopped && !ok {
		return path, "invalid JSON", true
	}
	return rp, rw, bad
}

// leaf has protojson judge {key: raw} as a message md; fd may be nil (an
// extension key).
func (d *diagnoser) leaf(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, key string, raw []byte, path string) (string, string, bool) {
	msg, ok := d.try(md, key, raw)
	if ok {
		return "", "", false
	}
	if fd == nil {
		return path, msg, true
	}
	return path, d.what(fd, raw, msg), true
}

// leafMessage has protojson judge raw as a whole message of type md (a
// well-known type given at the top level).
func (d *diagnoser) leafMessage(md protoreflect.MessageDescriptor, raw []byte, path string) (string, string, bool) {
	m := dynamicpb.NewMessage(md)
	err := protojson.UnmarshalOptions{DiscardUnknown: d.discard, Resolver: d.types}.Unmarshal(raw, m)
	if err == nil {
		return "", "", false
	}
	return path, wellKnownWhat(md, raw, cleanProtoError(err)), true
}

// try unmarshals {key: raw} into a fresh md and reports protojson's error.
func (d *diagnoser) try(md protoreflect.MessageDescriptor, key string, raw []byte) (string, bool) {
	qk, _ := json.Marshal(key)
	doc := concat("{", qk, ":", raw, "}")
	m := dynamicpb.NewMessage(md)
	// With discard set protojson also drops unknown enum names: judge the
	// piece as the whole was judged.
	err := protojson.UnmarshalOptions{DiscardUnknown: d.discard, Resolver: d.types}.Unmarshal(doc, m)
	if err == nil {
		return "", true
	}
	return cleanProtoError(err), false
}

// what words a value protojson refused for a field (or list element, or map
// key or value) of kind fd.
func (d *diagnoser) what(fd protoreflect.FieldDescriptor, raw []byte, protoMsg string) string {
	kind := jsonKind(raw)
	typ := fd.Kind().String()
	switch fd.Kind() {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return intWhat(fd.Kind(), typ, raw, kind, protoMsg)
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		if kind != "number" && kind != "string" {
			return "expected " + typ + ", got " + kind
		}
		s := numberText(raw, kind)
		bits := 64
		if fd.Kind() == protoreflect.FloatKind {
			bits = 32
		}
		if _, err := strconv.ParseFloat(s, bits); errors.Is(err, strconv.ErrRange) {
			return "out of range for " + typ + ": " + shorten(s)
		}
		if kind == "string" {
			return "expected " + typ + ", got string " + shorten(string(raw))
		}
		return "invalid " + typ + ": " + protoMsg
	case protoreflect.BoolKind:
		return "expected bool, got " + kindWithValue(raw, kind)
	case protoreflect.StringKind:
		if kind == "string" && !utf8.Valid(raw) {
			return "invalid UTF-8 in string"
		}
		return "expected string, got " + kindWithValue(raw, kind)
	case protoreflect.BytesKind:
		if kind != "string" {
			return "expected base64 string (bytes), got " + kind
		}
		var s string
		_ = json.Unmarshal(raw, &s)
		if _, err := base64.StdEncoding.DecodeString(s); err != nil {
			if _, err2 := base64.URLEncoding.DecodeString(s); err2 != nil {
				return "invalid base64 (bytes): " + shorten(string(raw))
			}
		}
		return "invalid bytes: " + protoMsg
	case protoreflect.EnumKind:
		enum := string(fd.Enum().FullName())
		switch kind {
		case "string":
			return fmt.Sprintf("unknown value %s of enum %s", shorten(string(raw)), enum)
		case "number":
			return fmt.Sprintf("invalid number %s for enum %s (an int32)", shorten(string(raw)), enum)
		}
		return "expected enum " + enum + " (name or number), got " + kind
	case protoreflect.MessageKind, protoreflect.GroupKind:
		name := string(fd.Message().FullName())
		if isWellKnown(fd.Message()) {
			return wellKnownWhat(fd.Message(), raw, protoMsg)
		}
		return "expected object (" + name + "), got " + kind
	}
	return protoMsg
}

func intWhat(k protoreflect.Kind, typ string, raw []byte, kind, protoMsg string) string {
	if kind != "number" && kind != "string" {
		return "expected " + typ + ", got " + kind
	}
	s := numberText(raw, kind)
	f, ok := new(big.Float).SetPrec(256).SetString(s)
	if !ok {
		return "expected " + typ + ", got " + kindWithValue(raw, kind)
	}
	if !f.IsInt() {
		return "not an integer: " + shorten(s)
	}
	n, _ := f.Int(nil)
	var lo, hi *big.Int
	switch k {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		lo, hi = big.NewInt(math.MinInt32), big.NewInt(math.MaxInt32)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		lo, hi = big.NewInt(math.MinInt64), big.NewInt(math.MaxInt64)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		lo, hi = big.NewInt(0), big.NewInt(math.MaxUint32)
	default:
		lo, hi = big.NewInt(0), new(big.Int).SetUint64(math.MaxUint64)
	}
	if n.Cmp(lo) < 0 || n.Cmp(hi) > 0 {
		return "out of range for " + typ + ": " + shorten(s)
	}
	return "invalid " + typ + ": " + protoMsg
}

// numberText is the number a JSON number or string holds, as text.
func numberText(raw []byte, kind string) string {
	if kind == "string" {
		var s string
		_ = json.Unmarshal(raw, &s)
		return strings.TrimSpace(s)
	}
	return string(bytes.TrimSpace(raw))
}

func kindWithValue(raw []byte, kind string) string {
	switch kind {
	case "string", "number", "boolean":
		return kind + " " + shorten(string(bytes.TrimSpace(raw)))
	}
	return kind
}

// shorten keeps error texts short when the input is long.
func shorten(s string) string {
	const max = 40
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// jsonKind names the type of a valid JSON value.
func jsonKind(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func concat(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch p := p.(type) {
		case string:
			b = append(b, p...)
		case []byte:
			b = append(b, p...)
		case json.RawMessage:
			b = append(b, p...)
		}
	}
	return b
}

// isWellKnown tells the message types that protojson maps to something
// other than a JSON object of their fields (or to an object with rules of
// its own): they are judged whole.
func isWellKnown(md protoreflect.MessageDescriptor) bool {
	if md.ParentFile() == nil || md.ParentFile().Package() != "google.protobuf" {
		return false
	}
	switch md.Name() {
	case "Any", "Timestamp", "Duration", "Struct", "Value", "ListValue", "NullValue",
		"FieldMask", "Empty",
		"BoolValue", "Int32Value", "Int64Value", "UInt32Value", "UInt64Value",
		"FloatValue", "DoubleValue", "StringValue", "BytesValue":
		return true
	}
	return false
}

// goodValue is a JSON value that protojson accepts for a field of fd's
// type: the default value in its JSON form.
func goodValue(fd protoreflect.FieldDescriptor) []byte {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return []byte("false")
	case protoreflect.StringKind, protoreflect.BytesKind:
		return []byte(`""`)
	case protoreflect.MessageKind, protoreflect.GroupKind:
		md := fd.Message()
		if md.FullName() == "google.protobuf.Value" {
			return []byte("null")
		}
		b, err := protojson.Marshal(dynamicpb.NewMessage(md))
		if err != nil {
			return []byte("{}")
		}
		return b
	}
	return []byte("0") // numbers and enums
}

// wellKnownWhat words a value protojson refused for a well-known type.
func wellKnownWhat(md protoreflect.MessageDescriptor, raw []byte, protoMsg string) string {
	kind := jsonKind(raw)
	name := string(md.FullName())
	switch md.Name() {
	case "Timestamp":
		if kind != "string" {
			return "expected RFC 3339 string (" + name + "), got " + kind
		}
		return "invalid " + name + " " + shorten(string(raw)) + ` (RFC 3339, e.g. "2006-01-02T15:04:05.5Z", years 1 to 9999)`
	case "Duration":
		if kind != "string" {
			return "expected duration string (" + name + "), got " + kind
		}
		return "invalid " + name + " " + shorten(string(raw)) + ` (seconds with an "s" suffix, e.g. "1.5s", at most 315576000000s)`
	case "FieldMask":
		if kind != "string" {
			return `expected a string or {"paths": [strings]} (` + name + "), got " + kind
		}
	case "Struct", "Empty":
		if kind != "object" {
			return "expected object (" + name + "), got " + kind
		}
	case "ListValue":
		if kind != "array" {
			return "expected array (" + name + "), got " + kind
		}
	case "BoolValue", "Int32Value", "Int64Value", "UInt32Value", "UInt64Value",
		"FloatValue", "DoubleValue", "StringValue", "BytesValue":
		if v := md.Fields().ByName("value"); v != nil {
			return (&diagnoser{}).what(v, raw, protoMsg)
		}
	}
	return "invalid " + name + ": " + protoMsg
}
