package transcode

import (
	"encoding/json"
	"strings"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Schema is what a REST gateway needs to know about loaded files: their
// services' methods with the HTTP rules of their google.api.http options,
// and every message and enum those methods reach, field by field.
type Schema struct {
	Services []*Service          `json:"services"`
	Messages map[string]*MsgInfo `json:"messages"`
	Enums    map[string]*Enum    `json:"enums"`
}

// Service is one service of a described file.
type Service struct {
	Name    string    `json:"name"` // full name, "pkg.Svc"
	Comment string    `json:"comment,omitempty"`
	Methods []*Method `json:"methods"`
}

// Method is one method and its HTTP rules (additional_bindings flattened
// after the main rule).
type Method struct {
	Name    string  `json:"name"` // "SayHello"
	Input   string  `json:"input"`
	Output  string  `json:"output"`
	Comment string  `json:"comment,omitempty"`
	Stream  bool    `json:"stream,omitempty"` // client or server streaming
	HTTP    []*Rule `json:"http,omitempty"`
}

// Rule is one google.api.HttpRule binding.
type Rule struct {
	Method       string `json:"method"` // GET, POST, ... or a custom kind
	Path         string `json:"path"`
	Body         string `json:"body,omitempty"`
	ResponseBody string `json:"response_body,omitempty"`
}

// MsgInfo is a message type. The well-known types whose JSON forms are
// special (isWellKnown) carry only their name; the other messages of
// google.protobuf (SourceContext, Type, ...) are plain messages in JSON.
type MsgInfo struct {
	Comment string   `json:"comment,omitempty"`
	Fields  []*Field `json:"fields"`
}

// Field is one field of a message. Kind is the proto kind ("int32",
// "string", "enum", "message", ...); Type names the message or enum. A
// map field has Map set, Key the key kind, and Kind/Type for its values.
type Field struct {
	Name     string `json:"name"`
	Number   int32  `json:"number"`
	JSON     string `json:"json"`
	Kind     string `json:"kind"`
	Type     string `json:"type,omitempty"`
	Repeated bool   `json:"repeated,omitempty"`
	Map      bool   `json:"map,omitempty"`
	Key      string `json:"key,omitempty"`
	Oneof    string `json:"oneof,omitempty"`
	// Optional: a proto3 optional field (in a synthetic oneof). Presence:
	// an unset field outside a oneof is null in JSON that shows unset
	// fields (protojson's EmitUnpopulated), not its zero value (proto2
	// optional, editions' explicit presence, message fields).
	Optional bool `json:"optional,omitempty"`
	Presence bool `json:"presence,omitempty"`
	// Text: the field's name in text and in JSON with proto names, where
	// it is not Name (a group's: its message's name, "MyGroup").
	Text    string `json:"text,omitempty"`
	Comment string `json:"comment,omitempty"`
}

// Enum is an enum type: its value names in declaration order.
type Enum struct {
	Comment string   `json:"comment,omitempty"`
	Values  []string `json:"values"`
	Numbers []int32  `json:"numbers"`
}

// Describe loads path (as LoadFile does) and answers, as JSON text, the
// Schema of that file: its services and what their methods reach.
func (r *Registry) Describe(path string, importPaths []string) ([]byte, error) {
	if err := r.LoadFile(path, importPaths); err != nil {
		return nil, err
	}
	name, _, err := importName(path, importPaths)
	if err != nil {
		return nil, err
	}
	fd, err := r.snap.Load().files.FindFileByPath(name)
	if err != nil {
		return nil, &BadProtoError{File: path, What: "not loaded"}
	}
	s := DescribeFile(fd)
	return json.Marshal(s)
}

// DescribeFile is the Schema of one file descriptor.
func DescribeFile(fd protoreflect.FileDescriptor) *Schema {
	s := &Schema{Services: []*Service{}, Messages: map[string]*MsgInfo{}, Enums: map[string]*Enum{}}
	svcs := fd.Services()
	for i := 0; i < svcs.Len(); i++ {
		sd := svcs.Get(i)
		svc := &Service{Name: string(sd.FullName()), Comment: comment(sd), Methods: []*Method{}}
		mds := sd.Methods()
		for j := 0; j < mds.Len(); j++ {
			md := mds.Get(j)
			m := &Method{
				Name:    string(md.Name()),
				Input:   string(md.Input().FullName()),
				Output:  string(md.Output().FullName()),
				Comment: comment(md),
				Stream:  md.IsStreamingClient() || md.IsStreamingServer(),
				HTTP:    httpRules(md),
			}
			s.addMessage(md.Input())
			s.addMessage(md.Output())
			svc.Methods = append(svc.Methods, m)
		}
		s.Services = append(s.Services, svc)
	}
	return s
}

func (s *Schema) addMessage(md protoreflect.MessageDescriptor) {
	name := string(md.FullName())
	if _, ok := s.Messages[name]; ok {
		return
	}
	mi := &MsgInfo{Comment: comment(md), Fields: []*Field{}}
	s.Messages[name] = mi
	if isWellKnown(md) {
		return
	}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		fi := &Field{
			Name:     string(f.Name()),
			Number:   int32(f.Number()),
			JSON:     f.JSONName(),
			Repeated: f.Cardinality() == protoreflect.Repeated && !f.IsMap(),
			Presence: f.HasPresence() && f.ContainingOneof() == nil,
			Comment:  comment(f),
		}
		if f.TextName() != string(f.Name()) {
			fi.Text = f.TextName()
		}
		if o := f.ContainingOneof(); o != nil {
			if o.IsSynthetic() {
				fi.Optional = true
			} else {
				fi.Oneof = string(o.Name())
			}
		}
		vf := f
		if f.IsMap() {
			fi.Map = true
			fi.Key = f.MapKey().Kind().String()
			vf = f.MapValue()
		}
		fi.Kind = vf.Kind().String()
		switch vf.Kind() {
		case protoreflect.MessageKind, protoreflect.GroupKind:
			fi.Kind = "message"
			fi.Type = string(vf.Message().FullName())
			s.addMessage(vf.Message())
		case protoreflect.EnumKind:
			fi.Type = string(vf.Enum().FullName())
			s.addEnum(vf.Enum())
		}
		mi.Fields = append(mi.Fields, fi)
	}
}

func (s *Schema) addEnum(ed protoreflect.EnumDescriptor) {
	name := string(ed.FullName())
	if _, ok := s.Enums[name]; ok {
		return
	}
	e := &Enum{Comment: comment(ed), Values: []string{}, Numbers: []int32{}}
	vals := ed.Values()
	for i := 0; i < vals.Len(); i++ {
		e.Values = append(e.Values, string(vals.Get(i).Name()))
		e.Numbers = append(e.Numbers, int32(vals.Get(i).Number()))
	}
	s.Enums[name] = e
}

// comment is the leading comment of d in its file's source info (empty
// for files compiled without it, such as descriptor sets from protoc
// without --include_source_info), trimmed.
func comment(d protoreflect.Descriptor) string {
	loc := d.ParentFile().SourceLocations().ByDescriptor(d)
	c := loc.LeadingComments
	if c == "" {
		c = loc.TrailingComments
	}
	lines := strings.Split(strings.TrimSpace(c), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}

// httpRules reads the method's google.api.http option. Options are
// re-read through the global types (where the linked-in annotations
// package registers the extension), so a rule comes out the same whether
// the compiler kept it as an extension or as unknown bytes.
func httpRules(md protoreflect.MethodDescriptor) []*Rule {
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || opts == nil {
		return nil
	}
	b, err := proto.Marshal(opts)
	if err != nil || len(b) == 0 {
		return nil
	}
	var fresh descriptorpb.MethodOptions
	if err := (proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(b, &fresh); err != nil {
		return nil
	}
	if !proto.HasExtension(&fresh, annotations.E_Http) {
		return nil
	}
	hr, _ := proto.GetExtension(&fresh, annotations.E_Http).(*annotations.HttpRule)
	if hr == nil {
		return nil
	}
	var out []*Rule
	add := func(h *annotations.HttpRule) {
		r := &Rule{Body: h.GetBody(), ResponseBody: h.GetResponseBody()}
		switch p := h.GetPattern().(type) {
		case *annotations.HttpRule_Get:
			r.Method, r.Path = "GET", p.Get
		case *annotations.HttpRule_Put:
			r.Method, r.Path = "PUT", p.Put
		case *annotations.HttpRule_Post:
			r.Method, r.Path = "POST", p.Post
		case *annotations.HttpRule_Delete:
			r.Method, r.Path = "DELETE", p.Delete
		case *annotations.HttpRule_Patch:
			r.Method, r.Path = "PATCH", p.Patch
		case *annotations.HttpRule_Custom:
			r.Method, r.Path = strings.ToUpper(p.Custom.GetKind()), p.Custom.GetPath()
		default:
			return
		}
		out = append(out, r)
	}
	add(hr)
	for _, ab := range hr.GetAdditionalBindings() {
		add(ab)
	}
	return out
}
