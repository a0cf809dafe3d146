package transcode

import (
	"encoding/json"
	"math"
	"sort"
	"strconv"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/luaserial"
)

// A request table's NaN, ±inf and 64-bit integer cdata reach the JSON
// text as strings (luaserial.Mark): "NaN" for a double field is NaN, the
// digits for an int64 field are the integer. Where a value of any JSON
// type is read (google.protobuf.Struct, Value, ListValue) they would be
// strings instead, silently: proto3 JSON has no NaN or infinite number
// there (protojson refuses to write one), so those are refused, and a
// cdata becomes the number when a double holds it exactly, else it is
// refused.

// CheckLuaMarks returns js, the JSON text luaserial.ToJSONMarked wrote
// for a request table with marks, with each cdata inside a JSON-valued
// type written as the number, or the error for a mark there that has no
// number.
func (m *Message) CheckLuaMarks(js []byte, marks []luaserial.Mark) ([]byte, error) {
	if len(marks) == 0 {
		return js, nil
	}
	w := markWalker{lifter: lifter{js: js}, reg: m.reg, marks: marks}
	w.value(m.desc, w.ws(0), "")
	if w.err != nil {
		w.err.Message = m.Name()
		return js, w.err
	}
	if len(w.fixes) == 0 {
		return js, nil
	}
	out := make([]byte, 0, len(js))
	last := 0
	for _, k := range w.fixes {
		mk := marks[k]
		out = append(out, js[last:mk.At]...)
		out = luaserial.AppendJSONNumber(out, mk.Num)
		last = mk.End
	}
	return append(out, js[last:]...), nil
}

type markWalker struct {
	lifter
	reg   *Registry
	marks []luaserial.Mark
	fixes []int // the cdata marks to write as numbers
	err   *MessageError
}

// firstMark is the index of the first mark at or after offset i.
func (w *markWalker) firstMark(i int) int {
	return sort.Search(len(w.marks), func(k int) bool { return w.marks[k].At >= i })
}

func (w *markWalker) hasMark(i, end int) bool {
	k := w.firstMark(i)
	return k < len(w.marks) && w.marks[k].At < end
}

// value walks the value at i, of message type md, named path, and
// returns the offset after it, or -1 (invalid JSON, or an error found).
func (w *markWalker) value(md protoreflect.MessageDescriptor, i int, path string) int {
	if w.err != nil || w.firstMark(i) == len(w.marks) {
		return w.skip(i) // no mark from here on
	}
	if !isWellKnown(md) {
		return w.object(md, i, path)
	}
	end := w.skip(i)
	if end < 0 || !w.hasMark(i, end) {
		return end
	}
	switch md.FullName() {
	case "google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue":
		w.anyJSON(i, path)
	case "google.protobuf.Any":
		w.anyMessage(i, path)
	}
	if w.err != nil {
		return -1
	}
	return end
}

func (w *markWalker) object(md protoreflect.MessageDescriptor, i int, path string) int {
	if i >= len(w.js) || w.js[i] != '{' {
		return w.skip(i)
	}
	fields := md.Fields()
	return w.each(i, func(key string, _, at int) int {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd == nil {
			return w.skip(at)
		}
		vfd := fd
		if fd.IsMap() {
			vfd = fd.MapValue()
		}
		if vfd.Kind() != protoreflect.MessageKind && vfd.Kind() != protoreflect.GroupKind {
			return w.skip(at)
		}
		fpath := joinPath(path, key)
		switch {
		case fd.IsMap() && at < len(w.js) && w.js[at] == '{':
			return w.each(at, func(k string, _, eat int) int {
				qk, _ := json.Marshal(k)
				return w.value(vfd.Message(), eat, fpath+"["+string(qk)+"]")
			})
		case fd.IsList() && at < len(w.js) && w.js[at] == '[':
			return w.each(at, func(_ string, idx, eat int) int {
				return w.value(fd.Message(), eat, fpath+"["+strconv.Itoa(idx)+"]")
			})
		case fd.IsMap() || fd.IsList():
			return w.skip(at)
		}
		return w.value(fd.Message(), at, fpath)
	})
}

// anyMessage walks an Any's object at i: its type's fields, or the
// "value" of a well-known type. An unknown type is left to protojson.
func (w *markWalker) anyMessage(i int, path string) {
	url := ""
	w.each(i, func(key string, _, at int) int {
		if key == "@type" {
			if k, end, ok := w.key(at); ok {
				url = k
				return end
			}
		}
		return w.skip(at)
	})
	mt, err := w.reg.resolver().FindMessageByURL(url)
	if url == "" || err != nil {
		return
	}
	md := mt.Descriptor()
	if !isWellKnown(md) {
		w.object(md, i, path)
		return
	}
	w.each(i, func(key string, _, at int) int {
		if key == "value" {
			return w.value(md, at, joinPath(path, "value"))
		}
		return w.skip(at)
	})
}

// anyJSON checks the JSON value at i, read as a google.protobuf.Value,
// for marks, and returns the offset after it, or -1.
func (w *markWalker) anyJSON(i int, path string) int {
	if w.err != nil {
		return -1
	}
	if i < len(w.js) && (w.js[i] == '{' || w.js[i] == '[') {
		return w.each(i, func(key string, idx, at int) int {
			if w.js[i] == '{' {
				return w.anyJSON(at, joinPath(path, key))
			}
			return w.anyJSON(at, path+"["+strconv.Itoa(idx)+"]")
		})
	}
	end := w.skip(i)
	k := w.firstMark(i)
	if end < 0 || k == len(w.marks) || w.marks[k].At != i {
		return end
	}
	switch mk := w.marks[k]; {
	case !mk.Cdata:
		got := "NaN"
		if math.IsInf(mk.Num, 1) {
			got = "Infinity"
		} else if math.IsInf(mk.Num, -1) {
			got = "-Infinity"
		}
		w.err = &MessageError{Path: path, What: "expected a finite number (google.protobuf.Value), got " + got}
	case !mk.Exact:
		w.err = &MessageError{Path: path, What: "not exact as a double (google.protobuf.Value): " + string(w.js[mk.At+1:mk.End-1])}
	default:
		w.fixes = append(w.fixes, k)
		return end
	}
	return -1
}
