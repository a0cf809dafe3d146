// Package transcode turns JSON into protobuf bytes and back for messages
// whose schema is known only at run time: .proto files compiled in process
// (github.com/bufbuild/protocompile, no protoc) or descriptor sets
// (`protoc -o`). The JSON side is the proto3 JSON mapping (protojson):
// 64-bit integers as strings, bytes as base64, enums by name, the
// well-known types in their special forms.
//
// A Registry is safe for concurrent use: loads are serialised and publish a
// new immutable snapshot, so encoding and decoding never take a lock.
package transcode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/protoutil"
	"github.com/bufbuild/protocompile/reporter"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	// The well-known types: registered in protoregistry.GlobalFiles by
	// these packages, copied into every Registry so that imports of
	// google/protobuf/*.proto resolve without files on disk.
	_ "google.golang.org/protobuf/types/known/anypb"
	_ "google.golang.org/protobuf/types/known/apipb"
	_ "google.golang.org/protobuf/types/known/durationpb"
	_ "google.golang.org/protobuf/types/known/emptypb"
	_ "google.golang.org/protobuf/types/known/fieldmaskpb"
	_ "google.golang.org/protobuf/types/known/sourcecontextpb"
	_ "google.golang.org/protobuf/types/known/structpb"
	_ "google.golang.org/protobuf/types/known/timestamppb"
	_ "google.golang.org/protobuf/types/known/typepb"
	_ "google.golang.org/protobuf/types/known/wrapperspb"

	// google/api/annotations.proto and google/api/http.proto: the HTTP
	// rules a REST gateway reads (Describe), importable without files;
	// google/api/httpbody.proto: the message of raw HTTP bodies.
	_ "google.golang.org/genproto/googleapis/api/annotations"
	_ "google.golang.org/genproto/googleapis/api/httpbody"
)

// wellKnownFiles are the files of the well-known types, as protoc ships
// them, the two files of google.api.http and google.api.HttpBody's.
var wellKnownFiles = []string{
	"google/protobuf/any.proto",
	"google/protobuf/api.proto",
	"google/protobuf/descriptor.proto",
	"google/protobuf/duration.proto",
	"google/protobuf/empty.proto",
	"google/protobuf/field_mask.proto",
	"google/protobuf/source_context.proto",
	"google/protobuf/struct.proto",
	"google/protobuf/timestamp.proto",
	"google/protobuf/type.proto",
	"google/protobuf/wrappers.proto",
	"google/api/http.proto",
	"google/api/annotations.proto",
	"google/api/httpbody.proto",
}

// Registry holds the schemas loaded so far and the message types built from
// them.
type Registry struct {
	loadMu sync.Mutex // serialises loads; readers use snap only
	snap   atomic.Pointer[snapshot]
	// messages caches *Message by full name. Entries stay valid across
	// loads: a load may add files, never change or remove one.
	messages sync.Map
	// plans caches *plan by full name, for the fast paths.
	plans sync.Map
}

// snapshot is one immutable state of the registry.
type snapshot struct {
	files *protoregistry.Files
	types *dynamicpb.Types // resolves Any type URLs and extensions
}

// NewRegistry returns a registry that knows the well-known types only.
func NewRegistry() *Registry {
	files := new(protoregistry.Files)
	for _, name := range wellKnownFiles {
		fd, err := protoregistry.GlobalFiles.FindFileByPath(name)
		if err != nil {
			// The imports above register every one of them.
			panic(fmt.Sprintf("transcode: well-known file %s not linked in: %v", name, err))
		}
		if err := files.RegisterFile(fd); err != nil {
			panic(fmt.Sprintf("transcode: register %s: %v", name, err))
		}
	}
	r := &Registry{}
	r.snap.Store(&snapshot{files: files, types: dynamicpb.NewTypes(files)})
	return r
}

// BadProtoError is the error of a load that failed. Its text is
// "bad proto: <file>:<line>:<col>: <what>" for a parse or link error in a
// source file, "bad proto: <file>: <what>" otherwise.
type BadProtoError struct {
	File      string // the path on disk where known, else the import name
	Line, Col int    // 0 when the error has no position
	What      string
}

func (e *BadProtoError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("bad proto: %s:%d:%d: %s", e.File, e.Line, e.Col, e.What)
	}
	return fmt.Sprintf("bad proto: %s: %s", e.File, e.What)
}

// LoadFile compiles a .proto file and the files it imports, and registers
// them. Like protoc, the file and its imports are looked up in importPaths;
// without import paths, the file's own directory is the one import path.
// A file whose import name is already registered is not read again, so
// loading the same file twice is a no-op (the first load wins).
func (r *Registry) LoadFile(path string, importPaths []string) error {
	if path == "" {
		return &BadProtoError{File: "(empty path)", What: "no file name"}
	}
	name, importPaths, err := importName(path, importPaths)
	if err != nil {
		return err
	}

	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	cur := r.snap.Load()
	if _, err := cur.files.FindFileByPath(name); err == nil {
		return nil
	}

	// Where each import name was found on disk, to name files in errors as
	// the user knows them.
	var onDiskMu sync.Mutex
	onDisk := map[string]string{}
	source := &protocompile.SourceResolver{
		ImportPaths: importPaths,
		Accessor: func(p string) (io.ReadCloser, error) {
			f, err := os.Open(p)
			if err != nil {
				return nil, err
			}
			onDiskMu.Lock()
			onDisk[p] = p
			onDiskMu.Unlock()
			return f, nil
		},
	}
	diskName := func(importName string) string {
		onDiskMu.Lock()
		defer onDiskMu.Unlock()
		for _, ip := range importPaths {
			if p := filepath.Join(ip, importName); onDisk[p] != "" {
				return p
			}
		}
		if importName == name {
			return path
		}
		return importName
	}
	// Files already registered (the well-known types among them) resolve
	// to their registered descriptors, so that a message type is the same
	// whichever file's load brought it in.
	resolve := protocompile.ResolverFunc(func(p string) (protocompile.SearchResult, error) {
		if fd, err := cur.files.FindFileByPath(p); err == nil {
			return protocompile.SearchResult{Desc: fd}, nil
		}
		return source.FindFileByPath(p)
	})
	comp := protocompile.Compiler{
		Resolver:       resolve,
		MaxParallelism: 1,
		SourceInfoMode: protocompile.SourceInfoStandard, // comments, for Describe
	}
	// The compiler has no work to cancel that matters here: files are local.
	compiled, err := comp.Compile(context.Background(), name)
	if err != nil {
		return compileError(err, name, importPaths, diskName)
	}

	// Rebuild with protodesc against the registry: its descriptors are the
	// ones dynamicpb and protojson are fastest with, and it checks the
	// files against what is registered (a symbol defined twice).
	var protos []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var collect func(fd protoreflect.FileDescriptor)
	collect = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		if _, err := cur.files.FindFileByPath(fd.Path()); err == nil {
			return
		}
		imps := fd.Imports()
		for i := 0; i < imps.Len(); i++ {
			collect(imps.Get(i).FileDescriptor)
		}
		protos = append(protos, protoutil.ProtoFromFileDescriptor(fd))
	}
	for _, f := range compiled {
		collect(f)
	}
	return r.register(cur, protos, func(file string) string { return diskName(file) })
}

// importName finds the name the compiler resolves path by, and the import
// paths to use.
func importName(path string, importPaths []string) (string, []string, error) {
	if len(importPaths) == 0 {
		return filepath.Base(path), []string{filepath.Dir(path)}, nil
	}
	// protoc's rule: a name relative to an import path...
	if !filepath.IsAbs(path) {
		for _, ip := range importPaths {
			if _, err := os.Stat(filepath.Join(ip, path)); err == nil {
				return filepath.ToSlash(filepath.Clean(path)), importPaths, nil
			}
		}
	}
	// ...or a file on disk that lies under one...
	if _, err := os.Stat(path); err == nil {
		if abs, err := filepath.Abs(path); err == nil {
			for _, ip := range importPaths {
				ipAbs, err := filepath.Abs(ip)
				if err != nil {
					continue
				}
				rel, err := filepath.Rel(ipAbs, abs)
				if err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
					return filepath.ToSlash(rel), importPaths, nil
				}
			}
		}
		return "", nil, &BadProtoError{File: path, What: "file is not under any import path (" + strings.Join(importPaths, ", ") + ")"}
	}
	// ...or a name that is not on disk (any more): it may be loaded
	// already, else compiling it says it is not found.
	if !filepath.IsAbs(path) {
		return filepath.ToSlash(filepath.Clean(path)), importPaths, nil
	}
	return "", nil, &BadProtoError{File: path, What: "file not found"}
}

// compileError shapes a protocompile error as a BadProtoError.
func compileError(err error, name string, importPaths []string, diskName func(string) string) error {
	var ewp reporter.ErrorWithPos
	if errors.As(err, &ewp) {
		pos := ewp.GetPosition()
		file := pos.Filename
		if file == "" {
			file = name
		}
		what := ewp.Unwrap().Error()
		if errors.Is(ewp.Unwrap(), fs.ErrNotExist) {
			// Positioned at an import statement: say which import, not
			// which of the candidate paths was tried last.
			what = "import not found in import paths (" + strings.Join(importPaths, ", ") + ")"
		}
		return &BadProtoError{File: diskName(file), Line: pos.Line, Col: pos.Col, What: what}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return &BadProtoError{File: diskName(name), What: "file not found"}
	}
	return &BadProtoError{File: diskName(name), What: err.Error()}
}

// LoadDescriptorSet registers the files of a serialized
// google.protobuf.FileDescriptorSet (`protoc -o`, with or without
// --include_imports: imports may also come from earlier loads or be
// well-known types). Files already registered are skipped.
func (r *Registry) LoadDescriptorSet(b []byte) error {
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		return &BadProtoError{File: "descriptor set", What: strings.TrimPrefix(err.Error(), "proto: ")}
	}
	if len(set.File) == 0 {
		return &BadProtoError{File: "descriptor set", What: "no files"}
	}
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	cur := r.snap.Load()

	byName := make(map[string]*descriptorpb.FileDescriptorProto, len(set.File))
	for _, f := range set.File {
		if f.GetName() == "" {
			return &BadProtoError{File: "descriptor set", What: "file without a name"}
		}
		byName[f.GetName()] = f
	}
	// Dependencies first; a cycle or a missing import is reported by
	// protodesc when the file is built.
	var protos []*descriptorpb.FileDescriptorProto
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(f *descriptorpb.FileDescriptorProto)
	visit = func(f *descriptorpb.FileDescriptorProto) {
		if state[f.GetName()] != 0 {
			return
		}
		state[f.GetName()] = 1
		for _, dep := range f.Dependency {
			if d, ok := byName[dep]; ok {
				visit(d)
			}
		}
		state[f.GetName()] = 2
		if _, err := cur.files.FindFileByPath(f.GetName()); err == nil {
			return
		}
		protos = append(protos, f)
	}
	for _, f := range set.File {
		visit(f)
	}
	return r.register(cur, protos, func(file string) string { return file })
}

// register builds protos (dependencies first) on top of cur and publishes
// the result. Nothing is published when one file fails.
func (r *Registry) register(cur *snapshot, protos []*descriptorpb.FileDescriptorProto, diskName func(string) string) error {
	if len(protos) == 0 {
		return nil
	}
	files := new(protoregistry.Files)
	var copyErr error
	cur.files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		copyErr = files.RegisterFile(fd)
		return copyErr == nil
	})
	if copyErr != nil {
		return fmt.Errorf("transcode: copy registry: %w", copyErr)
	}
	for _, p := range protos {
		fd, err := protodesc.NewFile(p, files)
		if err != nil {
			return &BadProtoError{File: diskName(p.GetName()), What: err.Error()}
		}
		if err := files.RegisterFile(fd); err != nil {
			return &BadProtoError{File: diskName(p.GetName()), What: err.Error()}
		}
	}
	r.snap.Store(&snapshot{files: files, types: dynamicpb.NewTypes(files)})
	return nil
}

// Message returns the message type with the given full name ("pkg.Msg").
// The result is cached: calls for a known name cost one map lookup.
func (r *Registry) Message(name string) (*Message, error) {
	if m, ok := r.messages.Load(name); ok {
		return m.(*Message), nil
	}
	cur := r.snap.Load()
	d, err := cur.files.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil, &MessageError{Message: name, What: "unknown message type"}
	}
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		return nil, &MessageError{Message: name, What: "not a message type"}
	}
	m := &Message{reg: r, desc: md, typ: dynamicpb.NewMessageType(md), plan: r.planFor(md),
		masks: reachesFieldMask(md, map[protoreflect.FullName]bool{})}
	actual, _ := r.messages.LoadOrStore(name, m)
	return actual.(*Message), nil
}

// resolver returns the current types for Any and extensions.
func (r *Registry) resolver() *dynamicpb.Types {
	return r.snap.Load().types
}
