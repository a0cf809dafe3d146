package transcode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestWellKnownWithoutFiles(t *testing.T) {
	r := NewRegistry()
	m, err := r.Message("google.protobuf.Timestamp")
	if err != nil {
		t.Fatal(err)
	}
	pb, err := m.Encode(nil, []byte(`"2001-02-03T04:05:06Z"`), EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	js, err := m.Decode(nil, pb, DecodeOptions{})
	if err != nil || string(js) != `"2001-02-03T04:05:06Z"` {
		t.Fatalf("got %s, %v", js, err)
	}
	// A file importing them compiles with no google/ directory anywhere.
	dir := writeFiles(t, map[string]string{"w.proto": `syntax = "proto3"; package w;
import "google/protobuf/struct.proto"; import "google/protobuf/any.proto"; import "google/protobuf/empty.proto";
message M { google.protobuf.Struct s = 1; google.protobuf.Any a = 2; google.protobuf.Empty e = 3; }`})
	if err := r.LoadFile(filepath.Join(dir, "w.proto"), nil); err != nil {
		t.Fatal(err)
	}
	m = mustMessage(t, r, "w.M")
	// An Any resolves types the registry knows.
	in := `{"s":{"k":"v"},"a":{"@type":"type.googleapis.com/google.protobuf.Duration","value":"1s"},"e":{}}`
	pb, err = m.Encode(nil, []byte(in), EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	js, err = m.Decode(nil, pb, DecodeOptions{})
	if err != nil || string(js) != in {
		t.Fatalf("got %s, %v", js, err)
	}
}

func TestLoadTwiceIsNoop(t *testing.T) {
	src, err := os.ReadFile(greeterProto)
	if err != nil {
		t.Fatal(err)
	}
	dir := writeFiles(t, map[string]string{"greeter.proto": string(src)})
	r := NewRegistry()
	p := filepath.Join(dir, "greeter.proto")
	if err := r.LoadFile(p, nil); err != nil {
		t.Fatal(err)
	}
	m1 := mustMessage(t, r, "demo.AllKinds")
	// Not read again: a second load succeeds with the file gone.
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := r.LoadFile(p, nil); err != nil {
		t.Fatalf("second load: %v", err)
	}
	if err := r.LoadFile("greeter.proto", []string{dir}); err != nil {
		t.Fatalf("same file by import name: %v", err)
	}
	if m2 := mustMessage(t, r, "demo.AllKinds"); m2 != m1 {
		t.Fatal("message type changed by a no-op load")
	}
	// The descriptor set of the same file is a no-op too.
	set, err := os.ReadFile("../../demo/proto/greeter.protoset")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.LoadDescriptorSet(set); err != nil {
		t.Fatal(err)
	}
}

func TestLoadImportPaths(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"api/svc/v1/svc.proto": `syntax = "proto3"; package svc.v1; import "common/types.proto";
message Req { common.Id id = 1; }`,
		"third/common/types.proto": `syntax = "proto3"; package common; message Id { int64 v = 1; }`,
	})
	ips := []string{filepath.Join(dir, "api"), filepath.Join(dir, "third")}

	// By import name, as protoc takes it.
	r := NewRegistry()
	if err := r.LoadFile("svc/v1/svc.proto", ips); err != nil {
		t.Fatal(err)
	}
	m := mustMessage(t, r, "svc.v1.Req")
	pb, err := m.Encode(nil, []byte(`{"id":{"v":"5"}}`), EncodeOptions{})
	if err != nil || string(pb) != "\x0a\x02\x08\x05" {
		t.Fatalf("got %x, %v", pb, err)
	}
	// The imported file is registered too.
	mustMessage(t, r, "common.Id")

	// By a path on disk under an import path.
	r = NewRegistry()
	if err := r.LoadFile(filepath.Join(dir, "api/svc/v1/svc.proto"), ips); err != nil {
		t.Fatal(err)
	}
	mustMessage(t, r, "svc.v1.Req")

	// A file outside every import path.
	r = NewRegistry()
	err = r.LoadFile(filepath.Join(dir, "third/common/types.proto"), []string{filepath.Join(dir, "api")})
	if err == nil || !strings.HasPrefix(err.Error(), "bad proto: "+filepath.Join(dir, "third/common/types.proto")+": file is not under any import path") {
		t.Fatalf("got %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"syntax.proto":   "syntax = \"proto3\";\npackage x;\nmessage A {\n  string name = 1\n}\n",
		"undef.proto":    "syntax = \"proto3\";\npackage x;\nmessage B {\n  Missing m = 1;\n}\n",
		"imp.proto":      "syntax = \"proto3\";\npackage x;\nimport \"nothere.proto\";\n",
		"importer.proto": "syntax = \"proto3\";\npackage y;\nimport \"syntax.proto\";\n",
		"dup1.proto":     "syntax = \"proto3\";\npackage d;\nmessage Same {}\n",
		"dup2.proto":     "syntax = \"proto3\";\npackage d;\nmessage Same {}\n",
	})
	at := func(f string) string { return filepath.Join(dir, f) }
	cases := []struct {
		file string
		want string
	}{
		{"syntax.proto", "bad proto: " + at("syntax.proto") + ":5:1: syntax error: expecting ';'"},
		{"undef.proto", "bad proto: " + at("undef.proto") + ":4:3: field x.B.m: unknown type Missing"},
		{"imp.proto", "bad proto: " + at("imp.proto") + ":3:8: import not found in import paths (" + dir + ")"},
		// The error is in the imported file, and named by its path.
		{"importer.proto", "bad proto: " + at("syntax.proto") + ":5:1: syntax error"},
		{"absent.proto", "bad proto: " + at("absent.proto") + ": file not found"},
	}
	for _, c := range cases {
		r := NewRegistry()
		err := r.LoadFile(at(c.file), nil)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: got %v\nwant prefix %s", c.file, err, c.want)
		}
	}

	// A symbol defined by two files: the second load fails, the first stays.
	r := NewRegistry()
	if err := r.LoadFile(at("dup1.proto"), nil); err != nil {
		t.Fatal(err)
	}
	err := r.LoadFile(at("dup2.proto"), nil)
	if err == nil || !strings.HasPrefix(err.Error(), "bad proto: ") || !strings.Contains(err.Error(), "d.Same") {
		t.Fatalf("duplicate: %v", err)
	}
	mustMessage(t, r, "d.Same")

	if err := r.LoadFile("", nil); err == nil || !strings.HasPrefix(err.Error(), "bad proto: ") {
		t.Fatalf("empty path: %v", err)
	}
}

func TestLoadDescriptorSet(t *testing.T) {
	// protoc -o --include_imports output (make proto writes it).
	set, err := os.ReadFile("../../demo/proto/greeter.protoset")
	if err != nil {
		t.Fatal(err)
	}
	r := NewRegistry()
	if err := r.LoadDescriptorSet(set); err != nil {
		t.Fatal(err)
	}
	m := mustMessage(t, r, "demo.HelloRequest")
	pb, err := m.Encode(nil, []byte(`{"name":"set"}`), EncodeOptions{})
	if err != nil || string(pb) != "\x0a\x03set" {
		t.Fatalf("got %x, %v", pb, err)
	}

	// Without --include_imports: the imports are well-known types.
	fdp := protodesc.ToFileDescriptorProto(demopb.File_greeter_proto)
	only, err := proto.Marshal(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{fdp}})
	if err != nil {
		t.Fatal(err)
	}
	r = NewRegistry()
	if err := r.LoadDescriptorSet(only); err != nil {
		t.Fatal(err)
	}
	mustMessage(t, r, "demo.AllKinds")

	bad := []struct {
		name string
		set  []byte
		want string
	}{
		{"garbage", []byte("\xff\xff\xff"), "bad proto: descriptor set: "},
		{"empty", nil, "bad proto: descriptor set: no files"},
		{"missing import", mustSet(t, &descriptorpb.FileDescriptorProto{
			Name: proto.String("a.proto"), Package: proto.String("a"), Dependency: []string{"b.proto"}, Syntax: proto.String("proto3"),
		}), "bad proto: a.proto: "},
		{"unknown type", mustSet(t, &descriptorpb.FileDescriptorProto{
			Name: proto.String("c.proto"), Package: proto.String("c"), Syntax: proto.String("proto3"),
			MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("M"), Field: []*descriptorpb.FieldDescriptorProto{{
				Name: proto.String("f"), Number: proto.Int32(1), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".c.Nope"),
			}}}},
		}), "bad proto: c.proto: "},
	}
	for _, c := range bad {
		r := NewRegistry()
		err := r.LoadDescriptorSet(c.set)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: got %v, want prefix %q", c.name, err, c.want)
		}
	}
}

func mustSet(t *testing.T, files ...*descriptorpb.FileDescriptorProto) []byte {
	t.Helper()
	b, err := proto.Marshal(&descriptorpb.FileDescriptorSet{File: files})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Loads publish new snapshots while calls transcode: run with -race.
func TestConcurrentLoadAndTranscode(t *testing.T) {
	r := demoRegistry(t)
	m := mustMessage(t, r, "demo.AllKinds")
	in := []byte(`{"i64":"1","meta":{"x":1},"value":{"y":[1]}}`)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				pb, err := m.Encode(nil, in, EncodeOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := m.Decode(nil, pb, DecodeOptions{}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("f%d.proto", i)
		dir := writeFiles(t, map[string]string{name: fmt.Sprintf("syntax = \"proto3\"; package p%d; message M { int32 x = 1; }", i)})
		if err := r.LoadFile(filepath.Join(dir, name), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Message(fmt.Sprintf("p%d.M", i)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}
