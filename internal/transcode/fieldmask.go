package transcode

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A google.protobuf.FieldMask in the proto3 JSON mapping is one string of
// lowerCamelCase paths ("user.displayName,photo") that protojson turns
// back into .proto names. That form cannot name a field whose .proto
// name is not lower_snake_case: en_GB, Num and STATUS read back as
// en_g_b, _num and _s_t_a_t_u_s, and protojson refuses any path with an
// underscore. Nor can it name a key of a Struct as the key is written.
// grpc-gateway builds such masks in Go, where they are only strings.
//
// So a request may also give a FieldMask in its message form,
// {"paths": ["en_GB", "thing.subThing.sub_value"]}, the paths taken as
// they are. protojson refuses every JSON object for a FieldMask, so this
// form adds to what is accepted and changes nothing protojson accepts.
// The fast path reads it (fieldMaskObject); for the slow path, which is
// protojson, liftFieldMasks takes each such mask out of the JSON text
// before protojson reads it and puts its paths into the message after.

const fieldMaskName protoreflect.FullName = "google.protobuf.FieldMask"

// fieldMaskObject encodes the FieldMask in message form at the read
// position: {} or {"paths": [strings]}. Anything else is left to the
// slow path (false).
func (e *fastEncoder) fieldMaskObject(out []byte) ([]byte, bool) {
	if !e.consume('{') {
		return out, false
	}
	for i := 0; ; i++ {
		more, ok := e.jsonNext('}', i == 0)
		if !ok || !more {
			return out, ok
		}
		key, ok := e.text()
		if !ok || i > 0 || string(key) != "paths" || !e.consume(':') || !e.consume('[') {
			return out, false
		}
		for j := 0; ; j++ {
			more, ok := e.jsonNext(']', j == 0)
			if !ok {
				return out, false
			}
			if !more {
				break
			}
			p, ok := e.text()
			if !ok {
				return out, false
			}
			out = protowire.AppendTag(out, 1, protowire.BytesType)
			out = protowire.AppendBytes(out, p)
		}
	}
}

// maskPaths reads raw as a FieldMask in message form; ok is false for
// anything else (a string, null, another key, a key given twice, a path
// that is not a string, invalid UTF-8: protojson refuses those and says
// why), as for fieldMaskObject.
func maskPaths(raw []byte) (paths []string, ok bool) {
	if len(raw) == 0 || raw[0] != '{' || !utf8.Valid(raw) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	next := func() json.Token {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		return t
	}
	if next() != json.Delim('{') {
		return nil, false
	}
	paths = []string{}
	if !dec.More() {
		return paths, next() == json.Delim('}')
	}
	if next() != "paths" || next() != json.Delim('[') {
		return nil, false
	}
	for dec.More() {
		p, isString := next().(string)
		if !isString {
			return nil, false
		}
		paths = append(paths, p)
	}
	if next() != json.Delim(']') || dec.More() || next() != json.Delim('}') {
		return nil, false
	}
	return paths, true
}

// maskStep is one step from a message down to a message inside it: a
// singular field, an item of a list, or an entry of a map (its key in
// JSON form).
type maskStep struct {
	fd  protoreflect.FieldDescriptor
	idx int
	key string
}

// maskLift is one FieldMask taken out of the JSON text: where it sits
// and its paths.
type maskLift struct {
	steps []maskStep
	paths []string
}

// reachesFieldMask tells whether a message of type md can hold a
// FieldMask in a field of its own or of a message inside it (Any and
// the other well-known types aside).
func reachesFieldMask(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if md.FullName() == fieldMaskName {
		return true
	}
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
			continue
		}
		if fd.Message().FullName() == fieldMaskName ||
			!isWellKnown(fd.Message()) && reachesFieldMask(fd.Message(), seen) {
			return true
		}
	}
	return false
}

// liftFieldMasks returns js with every FieldMask in message form replaced
// by "" (an empty mask, which protojson reads), and where each was. The
// walk follows protojson's reading of js (a field by JSON name, then by
// .proto name); whatever it does not understand it leaves as it is, for
// protojson to judge. It reads js once, by offsets, without copying: its
// cost is linear in the text's length whatever the nesting (its
// recursion is as deep as the text's nesting, which Encode has bounded).
func liftFieldMasks(md protoreflect.MessageDescriptor, js []byte) ([]byte, []maskLift) {
	l := lifter{js: js}
	l.value(md, l.ws(0), nil)
	if len(l.spans) == 0 {
		return js, nil
	}
	out := make([]byte, 0, len(js))
	last := 0
	for _, s := range l.spans {
		out = append(out, js[last:s[0]]...)
		out = append(out, `""`...)
		last = s[1]
	}
	return append(out, js[last:]...), l.lifts
}

type lifter struct {
	js    []byte
	spans [][2]int // the masks' values in js, in order
	lifts []maskLift
}

// stepChain is the way down to a value, from its last step up: each level
// adds one link, where a slice would be copied.
type stepChain struct {
	step maskStep
	up   *stepChain
}

func (c *stepChain) steps() []maskStep {
	n := 0
	for x := c; x != nil; x = x.up {
		n++
	}
	steps := make([]maskStep, n)
	for x := c; x != nil; x = x.up {
		n--
		steps[n] = x.step
	}
	return steps
}

func (l *lifter) ws(i int) int {
	for i < len(l.js) {
		switch l.js[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the offset after the string that starts at i (a
// quote), or -1.
func (l *lifter) stringEnd(i int) int {
	for i++; i < len(l.js); i++ {
		switch l.js[i] {
		case '"':
			return i + 1
		case '\\':
			i++
		}
	}
	return -1
}

// skip returns the offset after the value at i (valid or not: protojson
// judges it), or -1 when the text ends first.
func (l *lifter) skip(i int) int {
	depth := 0
	for i < len(l.js) {
		switch l.js[i] {
		case '"':
			if i = l.stringEnd(i); i < 0 {
				return -1
			}
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of the enclosing object or array
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	if depth == 0 {
		return i
	}
	return -1
}

// key reads the object key at i; ok is false when there is none.
func (l *lifter) key(i int) (key string, end int, ok bool) {
	if i >= len(l.js) || l.js[i] != '"' {
		return "", i, false
	}
	end = l.stringEnd(i)
	if end < 0 {
		return "", i, false
	}
	raw := l.js[i:end]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), end, true
	}
	if json.Unmarshal(raw, &key) != nil {
		return "", i, false
	}
	return key, end, true
}

// each calls f for each value of the object or array at i (an object's
// with its key, an array's with its index) with the value's offset; f
// returns the offset after the value, or -1 to stop. each returns the
// offset after the object or array, or -1.
func (l *lifter) each(i int, f func(key string, idx, at int) int) int {
	if i >= len(l.js) || (l.js[i] != '{' && l.js[i] != '[') {
		return -1
	}
	closing := l.js[i] + 2 // '}' or ']'
	isObject := l.js[i] == '{'
	i = l.ws(i + 1)
	if i < len(l.js) && l.js[i] == closing {
		return i + 1
	}
	for idx := 0; ; idx++ {
		key := ""
		if isObject {
			var ok bool
			if key, i, ok = l.key(i); !ok {
				return -1
			}
			if i = l.ws(i); i >= len(l.js) || l.js[i] != ':' {
				return -1
			}
			i = l.ws(i + 1)
		}
		if i = f(key, idx, i); i < 0 {
			return -1
		}
		switch i = l.ws(i); {
		case i >= len(l.js):
			return -1
		case l.js[i] == closing:
			return i + 1
		case l.js[i] != ',':
			return -1
		}
		i = l.ws(i + 1)
	}
}

// object looks at the fields of the object at i, of message type md, and
// returns the offset after it, or -1.
func (l *lifter) object(md protoreflect.MessageDescriptor, i int, steps *stepChain) int {
	if i >= len(l.js) || l.js[i] != '{' {
		return l.skip(i)
	}
	fields := md.Fields()
	return l.each(i, func(key string, _, at int) int {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd == nil {
			return l.skip(at)
		}
		kind := fd.Kind()
		if fd.IsMap() {
			kind = fd.MapValue().Kind()
		}
		if kind != protoreflect.MessageKind && kind != protoreflect.GroupKind {
			return l.skip(at)
		}
		switch {
		case fd.IsMap() && at < len(l.js) && l.js[at] == '{':
			vmd := fd.MapValue().Message()
			return l.each(at, func(k string, _, eat int) int {
				return l.value(vmd, eat, &stepChain{maskStep{fd: fd, idx: -1, key: k}, steps})
			})
		case fd.IsList() && at < len(l.js) && l.js[at] == '[':
			return l.each(at, func(_ string, idx, eat int) int {
				return l.value(fd.Message(), eat, &stepChain{maskStep{fd: fd, idx: idx}, steps})
			})
		case fd.IsMap() || fd.IsList():
			return l.skip(at)
		}
		return l.value(fd.Message(), at, &stepChain{maskStep{fd: fd, idx: -1}, steps})
	})
}

// value looks at the value at i, of message type md, and returns the
// offset after it, or -1.
func (l *lifter) value(md protoreflect.MessageDescriptor, i int, steps *stepChain) int {
	if md.FullName() == fieldMaskName {
		end := l.skip(i)
		if end < 0 {
			return -1
		}
		if paths, ok := maskPaths(l.js[i:end]); ok {
			l.spans = append(l.spans, [2]int{i, end})
			l.lifts = append(l.lifts, maskLift{steps: steps.steps(), paths: paths})
		}
		return end
	}
	if isWellKnown(md) {
		return l.skip(i)
	}
	return l.object(md, i, steps)
}

// apply puts the mask's paths into m, the message protojson read from the
// lifted text (where the mask is an empty one).
func (lf maskLift) apply(m protoreflect.Message) bool {
	for _, s := range lf.steps {
		switch {
		case s.fd.IsMap():
			k, ok := mapKeyOf(s.fd.MapKey(), s.key)
			if !ok {
				return false
			}
			m = m.Mutable(s.fd).Map().Mutable(k).Message()
		case s.fd.IsList():
			list := m.Mutable(s.fd).List()
			if s.idx >= list.Len() {
				return false
			}
			m = list.Get(s.idx).Message()
		default:
			m = m.Mutable(s.fd).Message()
		}
	}
	pl := m.Mutable(m.Descriptor().Fields().ByNumber(1)).List()
	for _, p := range lf.paths {
		pl.Append(protoreflect.ValueOfString(p))
	}
	return true
}

// mapKeyOf is a map key from its JSON form, which protojson has accepted.
func mapKeyOf(fd protoreflect.FieldDescriptor, s string) (protoreflect.MapKey, bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(s).MapKey(), true
	case protoreflect.BoolKind:
		b, err := strconv.ParseBool(s)
		return protoreflect.ValueOfBool(b).MapKey(), err == nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		n, err := strconv.ParseInt(s, 10, 32)
		return protoreflect.ValueOfInt32(int32(n)).MapKey(), err == nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		n, err := strconv.ParseInt(s, 10, 64)
		return protoreflect.ValueOfInt64(n).MapKey(), err == nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		n, err := strconv.ParseUint(s, 10, 32)
		return protoreflect.ValueOfUint32(uint32(n)).MapKey(), err == nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		n, err := strconv.ParseUint(s, 10, 64)
		return protoreflect.ValueOfUint64(n).MapKey(), err == nil
	}
	return protoreflect.MapKey{}, false
}
