package nginx

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

const abeProto = "examples/internal/proto/examplepb/a_bit_of_everything.proto"

// copyProtoTree copies the directory src to dst, where nginx's workers can
// read it.
func copyProtoTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// compileABE compiles a_bit_of_everything.proto here, independently of
// the library, for the test server and for reading the answers.
func compileABE(t *testing.T, importPaths []string) protoreflect.FileDescriptor {
	t.Helper()
	return compileProto(t, importPaths, abeProto)
}

// compileProto compiles the file (an import name) as compileABE does.
func compileProto(t *testing.T, importPaths []string, file string) protoreflect.FileDescriptor {
	t.Helper()
	global := protocompile.ResolverFunc(func(p string) (protocompile.SearchResult, error) {
		fd, err := protoregistry.GlobalFiles.FindFileByPath(p)
		if err != nil {
			return protocompile.SearchResult{}, err
		}
		return protocompile.SearchResult{Desc: fd}, nil
	})
	comp := protocompile.Compiler{Resolver: protocompile.CompositeResolver{
		&protocompile.SourceResolver{ImportPaths: importPaths}, global,
	}}
	files, err := comp.Compile(context.Background(), file)
	if err != nil {
		t.Fatal(err)
	}
	return files[0]
}

// abeServer plays grpc-gateway's example ABitOfEverythingService
// (examples/internal/server/a_bit_of_everything.go) over qrpc, with
// dynamic messages: an in-memory store keyed by uuid for Create,
// CreateBody, Lookup, Update, UpdateV2, Delete, Custom, DoubleColon,
// GetQuery and Exists; Lookup sends the header uuid;
// CustomOptionsRequest the header allow; Timeout waits for the call's
// end; the other methods answer their request (or Empty).
type abeServer struct {
	mu   sync.Mutex
	v    map[string]*dynamicpb.Message
	next int
	seen map[string]int // calls by method
}

func (s *abeServer) calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[method]
}

func startABEServer(t *testing.T, sd protoreflect.ServiceDescriptor) (*abeServer, string) {
	t.Helper()
	s := &abeServer{v: map[string]*dynamicpb.Message{}, seen: map[string]int{}}
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	mds := sd.Methods()
	for i := 0; i < mds.Len(); i++ {
		srv.Handle(string(mds.Get(i).Name()), s.handler(mds.Get(i)))
	}
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return s, a.String()
}

func field(m protoreflect.Message, name string) protoreflect.FieldDescriptor {
	return m.Descriptor().Fields().ByName(protoreflect.Name(name))
}

// applyFieldMask is the example server's (fieldmask_helper.go), on
// dynamic messages.
func applyFieldMask(patchee, patcher protoreflect.Message, paths []string) {
	for _, path := range paths {
		names := strings.Split(path, ".")
		dst, src := patchee, patcher
		for _, n := range names[:len(names)-1] {
			dst = dst.Mutable(field(dst, n)).Message()
			src = src.Get(field(src, n)).Message()
		}
		fd := field(dst, names[len(names)-1])
		if src.Has(fd) {
			dst.Set(fd, src.Get(fd))
		} else {
			dst.Clear(fd)
		}
	}
}

func (s *abeServer) handler(md protoreflect.MethodDescriptor) qrpc.Handler {
	return func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		in := dynamicpb.NewMessage(md.Input())
		if err := proto.Unmarshal(req.Body, in); err != nil {
			resp.Code, resp.Body = 3, []byte("not a "+string(md.Input().FullName()))
			return
		}
		answer := func(m proto.Message) { resp.Body, _ = proto.Marshal(m) }
		notFound := func() { resp.Code, resp.Body = 5, []byte("not found") }
		uuidOf := func(m protoreflect.Message) string { return m.Get(field(m, "uuid")).String() }
		s.mu.Lock()
		defer s.mu.Unlock()
		s.seen[string(md.Name())]++
		switch md.Name() {
		case "Create", "CreateBody":
			s.next++
			uuid := fmt.Sprintf("%016x", s.next)
			in.Set(field(in, "uuid"), protoreflect.ValueOfString(uuid))
			s.v[uuid] = in
			answer(in)
		case "Lookup":
			uuid := uuidOf(in)
			resp.Headers = [][]byte{[]byte("uuid"), []byte(uuid)}
			if a, ok := s.v[uuid]; ok {
				answer(a)
				return
			}
			notFound()
		case "Update", "GetQuery", "Custom", "DoubleColon":
			uuid := uuidOf(in)
			if _, ok := s.v[uuid]; !ok {
				notFound()
				return
			}
			s.v[uuid] = in
			if md.Output().FullName() == md.Input().FullName() {
				answer(in)
			}
		case "UpdateV2":
			abe := in.Get(field(in, "abe")).Message()
			var paths []string
			if mf := field(in, "update_mask"); in.Has(mf) {
				l := in.Get(mf).Message()
				pl := l.Get(field(l, "paths")).List()
				for i := 0; i < pl.Len(); i++ {
					paths = append(paths, pl.Get(i).String())
				}
			}
			a, ok := s.v[uuidOf(abe)]
			if !ok {
				notFound()
				return
			}
			if len(paths) == 0 {
				s.v[uuidOf(abe)] = abe.Interface().(*dynamicpb.Message)
				return
			}
			applyFieldMask(a, abe, paths)
		case "Delete":
			uuid := uuidOf(in)
			if _, ok := s.v[uuid]; !ok {
				notFound()
				return
			}
			delete(s.v, uuid)
		case "Exists":
			if _, ok := s.v[uuidOf(in)]; !ok {
				notFound()
			}
		case "CustomOptionsRequest":
			resp.Headers = [][]byte{[]byte("allow"), []byte("OPTIONS, GET, HEAD, POST, PUT, TRACE")}
		case "Timeout":
			// the deadline the gateway sends (grpc-timeout, in ms) ends it,
			// as gRPC's deadline ends the example server's context
			wait := 5 * time.Second
			for i := 0; i+1 < len(req.Headers); i += 2 {
				if string(req.Headers[i]) == "grpc-timeout" {
					if d, err := time.ParseDuration(strings.TrimSuffix(string(req.Headers[i+1]), "m") + "ms"); err == nil {
						wait = d
					}
				}
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			s.mu.Lock()
			resp.Code, resp.Body = 4, []byte("context deadline exceeded")
		default:
			// GetRepeatedQuery, Echo, DeepPathEcho, Check*QueryParams,
			// TraceRequest: the request; the others: Empty
			if md.Output().FullName() == md.Input().FullName() {
				resp.Body = req.Body
			}
		}
	}
}

// TestGrpcGatewayABE runs grpc-gateway's integration cases for its
// ABitOfEverythingService (examples/internal/integration/integration_test.go:
// TestABE's unary cases, TestABEPatch, TestABEPatchBody,
// testAdditionalBindings, testABERepeated, TestTimeout,
// TestInvalidTimeout, TestPostWithEmptyBody, TestRequestQueryParams,
// TestNestedEnumGetQueryParams) against gateway.new{ compat =
// "grpc-gateway", codes = "grpc" } serving a_bit_of_everything.proto in
// front of abeServer. Each subtest is named after the case it follows and
// checks what it checks: answers are read as the upstream cases read
// them (protojson into the message, compared with proto.Equal). Left
// out: the StreamService cases (bulk create, list, download, bulk echo:
// streaming), the Grpc-Trailer-* half of testABELookupNotFound (qrpc has
// no trailers) and testABETrace (nginx answers TRACE itself).
func TestGrpcGatewayABE(t *testing.T) {
	dir := gatewayDir(t)
	gg, gapi := filepath.Join(dir, "gg"), filepath.Join(dir, "googleapis")
	copyProtoTree(t, filepath.Join(repoRoot, "nginx", "testdata", "grpc-gateway"), gg)
	copyProtoTree(t, filepath.Join(repoRoot, "nginx", "testdata", "googleapis"), gapi)
	fd := compileABE(t, []string{gg, gapi})
	sd := fd.Services().ByName("ABitOfEverythingService")
	abeMD := fd.Messages().ByName("ABitOfEverything")
	srv, addr := startABEServer(t, sd)
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        package.loaded.gw = assert(gateway.new{ upstream = qt.abe_addr,`,
			`            protos = { files = { "`+abeProto+`" },`,
			`                       import_paths = { qt.gg_dir, qt.gapi_dir } },`,
			`            compat = "grpc-gateway", codes = "grpc", opts = qt.opts({ timeout = 10000 }) })`,
		),
		Extra: map[string]string{"abe_addr": addr, "gg_dir": gg, "gapi_dir": gapi},
		// body: "payload.input_value" (a field of a field) is one binding
		// the gateway does not serve: it costs that route only
		AllowErrors: []string{`skipped POST /v1/example/a_bit_of_everything/nested_body_oneof of ` +
			`grpc\.gateway\.examples\.internal\.proto\.examplepb\.ABitOfEverythingService\.CreateNestedBodyOneof`},
		Server: `        location / { content_by_lua_block { package.loaded.gw:serve() } }`,
	})

	// msgOf parses JSON as the upstream cases' marshaler does (protojson,
	// unknown fields refused) into a message of type md.
	msgOf := func(t *testing.T, md protoreflect.MessageDescriptor, js string) *dynamicpb.Message {
		t.Helper()
		m := dynamicpb.NewMessage(md)
		if err := protojson.Unmarshal([]byte(js), m); err != nil {
			t.Fatalf("protojson.Unmarshal(%s): %v", js, err)
		}
		return m
	}
	// answer checks the status and reads the body as a message of type md
	answer := func(t *testing.T, r gwResp, status int, md protoreflect.MessageDescriptor) *dynamicpb.Message {
		t.Helper()
		if r.status != status {
			t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
		}
		return msgOf(t, md, r.body)
	}
	same := func(t *testing.T, got, want proto.Message) {
		t.Helper()
		if !proto.Equal(got, want) {
			g, _ := protojson.Marshal(got)
			w, _ := protojson.Marshal(want)
			t.Errorf("got  %s\nwant %s", g, w)
		}
	}
	marshal := func(t *testing.T, m proto.Message) string {
		t.Helper()
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	uuidOf := func(m *dynamicpb.Message) string { return m.Get(field(m, "uuid")).String() }
	clearUUID := func(m *dynamicpb.Message) { m.Clear(field(m, "uuid")) }
	ct := "application/json"
	// postABE and getABE are the upstream helpers
	postABE := func(t *testing.T, js string) string {
		t.Helper()
		r := n.rawReq(t, "POST", "/v1/example/a_bit_of_everything", marshal(t, msgOf(t, abeMD, js)), "Content-Type", ct)
		m := answer(t, r, 200, abeMD)
		if uuidOf(m) == "" {
			t.Fatalf("no uuid in %s", r.body)
		}
		return uuidOf(m)
	}
	getABE := func(t *testing.T, uuid string) *dynamicpb.Message {
		t.Helper()
		return answer(t, n.rawReq(t, "GET", "/v1/example/a_bit_of_everything/"+uuid, ""), 200, abeMD)
	}

	t.Run("testABECreate", func(t *testing.T) {
		want := msgOf(t, abeMD, `{"floatValue":1.5,"doubleValue":2.5,"int64Value":"4294967296",
			"uint64Value":"9223372036854775807","int32Value":-2147483648,"fixed64Value":"9223372036854775807",
			"fixed32Value":4294967295,"boolValue":true,"stringValue":"strprefix/foo","uint32Value":4294967295,
			"sfixed32Value":2147483647,"sfixed64Value":"-4611686018427387904","sint32Value":2147483647,
			"sint64Value":"4611686018427387903","nonConventionalNameValue":"camelCase","enumValue":"ZERO",
			"pathEnumValue":"DEF","nestedPathEnumValue":"JKL","enumValueAnnotation":"ONE"}`)
		// the upstream URL, formatted as it formats it (%f, %d, %v, %s)
		path := fmt.Sprintf("/v1/example/a_bit_of_everything/%f/%f/%d/separator/%d/%d/%d/%d/%v/%s/%d/%d/%d/%d/%d/%s/%s/%s/%s/%s",
			float32(1.5), 2.5, int64(4294967296), uint64(9223372036854775807), int32(-2147483648),
			uint64(9223372036854775807), uint32(4294967295), true, "strprefix/foo", uint32(4294967295),
			int32(2147483647), int64(-4611686018427387904), int32(2147483647), int64(4611686018427387903),
			"camelCase", "ZERO", "DEF", "JKL", "ONE")
		m := answer(t, n.rawReq(t, "POST", path, "{}", "Content-Type", ct), 200, abeMD)
		if uuidOf(m) == "" {
			t.Error("msg.Uuid is empty; want not empty")
		}
		clearUUID(m)
		same(t, m, want)
	})

	t.Run("testABECreateBody", func(t *testing.T) {
		want := msgOf(t, abeMD, `{"floatValue":1.5,"doubleValue":2.5,"int64Value":"4294967296",
			"uint64Value":"9223372036854775807","int32Value":-2147483648,"fixed64Value":"9223372036854775807",
			"fixed32Value":4294967295,"boolValue":true,"stringValue":"strprefix/foo","uint32Value":4294967295,
			"sfixed32Value":2147483647,"sfixed64Value":"-4611686018427387904","sint32Value":2147483647,
			"sint64Value":"4611686018427387903","nonConventionalNameValue":"camelCase","enumValue":"ONE",
			"pathEnumValue":"ABC","nestedPathEnumValue":"GHI",
			"nested":[{"name":"bar","amount":10},{"name":"baz","amount":20}],
			"repeatedStringValue":["a","b","c"],"oneofString":"x",
			"mapValue":{"a":"ONE","b":"ZERO"},"mappedStringValue":{"a":"x","b":"y"},
			"mappedNestedValue":{"a":{"name":"x","amount":1},"b":{"name":"y","amount":2}},
			"repeatedEnumAnnotation":["ONE","ZERO"],"enumValueAnnotation":"ONE",
			"repeatedStringAnnotation":["a","b"],
			"repeatedNestedAnnotation":[{"name":"hoge","amount":10},{"name":"fuga","amount":20}],
			"nestedAnnotation":{"name":"hoge","amount":10},"optionalStringValue":"optional-str"}`)
		r := n.rawReq(t, "POST", "/v1/example/a_bit_of_everything", marshal(t, want), "Content-Type", ct)
		m := answer(t, r, 200, abeMD)
		if uuidOf(m) == "" {
			t.Error("msg.Uuid is empty; want not empty")
		}
		clearUUID(m)
		same(t, m, want)
	})

	t.Run("testABELookup", func(t *testing.T) {
		r := n.rawReq(t, "POST", "/v1/example/a_bit_of_everything",
			`{"bool_value": true, "string_value": "strprefix/example"}`, "Content-Type", ct)
		want := answer(t, r, 200, abeMD)
		r = n.rawReq(t, "GET", "/v1/example/a_bit_of_everything/"+uuidOf(want), "")
		same(t, answer(t, r, 200, abeMD), want)
		if got := r.hdr.Get("Grpc-Metadata-Uuid"); got != uuidOf(want) {
			t.Errorf("Grpc-Metadata-Uuid was %s, wanted %s", got, uuidOf(want))
		}
	})

	t.Run("testABELookupNotFound", func(t *testing.T) {
		// useTrailers = false; with TE: trailers the upstream case wants
		// Grpc-Trailer-* (qrpc has no trailers), and the rest the same
		for _, hdrs := range [][]string{nil, {"TE", "trailers"}} {
			r := n.rawReq(t, "GET", "/v1/example/a_bit_of_everything/not_exist", "", hdrs...)
			e := expectError(t, "lookup not_exist", r, http.StatusNotFound)
			if e != nil && (e["code"] != float64(5) || e["message"] != "not found") {
				t.Errorf("code %v message %v, want 5 and \"not found\"", e["code"], e["message"])
			}
			if got := r.hdr.Get("Grpc-Metadata-Uuid"); got != "not_exist" {
				t.Errorf("Grpc-Metadata-Uuid was %s, wanted not_exist", got)
			}
		}
	})

	t.Run("testAdditionalBindings", func(t *testing.T) {
		strMD := sd.Methods().ByName("Echo").Input()
		pipe := func() gwResp {
			// a body of unknown length: sent chunked, as upstream's io.Pipe
			pr, pw := io.Pipe()
			go func() {
				_, _ = pw.Write([]byte(`"hello"`))
				_ = pw.Close()
			}()
			req, err := http.NewRequest("POST", n.url("/v2/example/echo"), pr)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", ct)
			resp, err := n.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return gwResp{resp.StatusCode, string(b), resp.Header}
		}
		for i, r := range []gwResp{
			n.rawReq(t, "GET", "/v1/example/a_bit_of_everything/echo/hello", ""),
			n.rawReq(t, "POST", "/v2/example/echo", `"hello"`, "Content-Type", ct),
			pipe(),
			n.rawReq(t, "GET", "/v2/example/echo?value=hello", ""),
		} {
			m := answer(t, r, 200, strMD)
			if got := m.Get(field(m, "value")).String(); got != "hello" {
				t.Errorf("%d: msg.GetValue() = %q; want hello", i, got)
			}
		}
	})

	t.Run("testABERepeated", func(t *testing.T) {
		md := fd.Messages().ByName("ABitOfEverythingRepeated")
		want := msgOf(t, md, `{"pathRepeatedFloatValue":[1.5,-1.5],"pathRepeatedDoubleValue":[2.5,-2.5],
			"pathRepeatedInt64Value":["4294967296","-4294967296"],"pathRepeatedUint64Value":["0","9223372036854775807"],
			"pathRepeatedInt32Value":[2147483647,-2147483648],"pathRepeatedFixed64Value":["0","9223372036854775807"],
			"pathRepeatedFixed32Value":[0,4294967295],"pathRepeatedBoolValue":[true,false],
			"pathRepeatedStringValue":["foo","bar"],"pathRepeatedBytesValue":["AA==","_w=="],
			"pathRepeatedUint32Value":[0,4294967295],"pathRepeatedEnumValue":["ZERO","ONE"],
			"pathRepeatedSfixed32Value":[2147483647,-2147483648],"pathRepeatedSfixed64Value":["4294967296","-4294967296"],
			"pathRepeatedSint32Value":[2147483647,-2147483648],"pathRepeatedSint64Value":["4611686018427387903","-4611686018427387904"]}`)
		// the upstream URL: each list joined with ",", bytes in URL-safe
		// base64, enums by name (%v)
		path := "/v1/example/a_bit_of_everything_repeated/1.5,-1.5/2.5,-2.5/4294967296,-4294967296/" +
			"0,9223372036854775807/2147483647,-2147483648/0,9223372036854775807/0,4294967295/true,false/" +
			"foo,bar/AA==,_w==/0,4294967295/ZERO,ONE/2147483647,-2147483648/4294967296,-4294967296/" +
			"2147483647,-2147483648/4611686018427387903,-4611686018427387904"
		same(t, answer(t, n.rawReq(t, "GET", path, ""), 200, md), want)
	})

	t.Run("testABEExists", func(t *testing.T) {
		r := n.rawReq(t, "POST", "/v1/example/a_bit_of_everything",
			`{"bool_value": true, "string_value": "strprefix/example"}`, "Content-Type", ct)
		want := answer(t, r, 200, abeMD)
		before := srv.calls("Exists")
		if r := n.rawReq(t, "HEAD", "/v1/example/a_bit_of_everything/"+uuidOf(want), ""); r.status != 200 {
			t.Errorf("resp.StatusCode = %d; want 200", r.status)
		}
		// not in the upstream case: HEAD is the custom HEAD binding's
		// (Exists), not the GET route's of the same path (Lookup)
		if srv.calls("Exists") != before+1 {
			t.Error("HEAD was not served by Exists")
		}
	})

	t.Run("testABEExistsNotFound", func(t *testing.T) {
		if r := n.rawReq(t, "HEAD", "/v1/example/a_bit_of_everything/not_exist", ""); r.status != 404 {
			t.Errorf("resp.StatusCode = %d; want 404", r.status)
		}
	})

	t.Run("testABEOptions", func(t *testing.T) {
		r := n.rawReq(t, "OPTIONS", "/v1/example/a_bit_of_everything/test",
			`{"bool_value": true, "string_value": "strprefix/example"}`, "Content-Type", ct)
		if r.status != 200 {
			t.Fatalf("resp.StatusCode = %d; want 200: %s", r.status, r.body)
		}
		if v := r.hdr.Get("Grpc-Metadata-Allow"); v != "OPTIONS, GET, HEAD, POST, PUT, TRACE" {
			t.Errorf("Grpc-Metadata-Allow %q does not have the expected HTTP methods", v)
		}
	})

	t.Run("TestABEPatch", func(t *testing.T) {
		uuid := postABE(t, `{"stringValue":"strprefix/bar","int32Value":32}`)
		// no Content-Type, as http.NewRequest sends it
		r := n.rawReq(t, "PATCH", "/v2/example/a_bit_of_everything/"+uuid, `{"string_value": "strprefix/foo"}`)
		if r.status != 200 {
			t.Errorf("patchResp.StatusCode= %d; want 200 resp: %v", r.status, r.body)
		}
		got := getABE(t, uuid)
		if v := got.Get(field(got, "string_value")).String(); v != "strprefix/foo" {
			t.Errorf("string_value= %q; want strprefix/foo", v)
		}
		if v := got.Get(field(got, "int32_value")).Int(); v != 32 {
			t.Errorf("int_32_value= %d; want 32", v)
		}
	})

	t.Run("TestABEPatchBody", func(t *testing.T) {
		updMD := fd.Messages().ByName("UpdateV2Request")
		for _, tc := range []struct{ name, original, input, want string }{
			{"with fieldmask provided",
				`{"int32Value":42,"stringValue":"rabbit","singleNested":{"name":"some value that will get overwritten","amount":345}}`,
				`{"abe":{"stringValue":"some value that won't get updated because it's not in the field mask","singleNested":{"amount":456}},"updateMask":"singleNested"}`,
				`{"int32Value":42,"stringValue":"rabbit","singleNested":{"amount":456}}`},
			{"with empty fieldmask",
				`{"int32Value":42,"stringValue":"some value that will get overwritten","singleNested":{"name":"value that will get empty","amount":345}}`,
				`{"abe":{"stringValue":"some updated value because the fieldMask is nil","singleNested":{"amount":456}},"updateMask":""}`,
				`{"stringValue":"some updated value because the fieldMask is nil","singleNested":{"amount":456}}`},
			{"with nil fieldmask",
				`{"int32Value":42,"stringValue":"some value that will get overwritten","singleNested":{"name":"value that will get empty","amount":123}}`,
				`{"abe":{"stringValue":"some updated value because the fieldMask is nil","singleNested":{"amount":657}}}`,
				`{"stringValue":"some updated value because the fieldMask is nil","singleNested":{"amount":657}}`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				uuid := postABE(t, tc.original)
				r := n.rawReq(t, "PATCH", "/v2a/example/a_bit_of_everything/"+uuid, marshal(t, msgOf(t, updMD, tc.input)))
				if r.status != 200 {
					t.Errorf("patchResp.StatusCode= %d; want 200 resp: %v", r.status, r.body)
				}
				got := getABE(t, uuid)
				clearUUID(got)
				same(t, got, msgOf(t, abeMD, tc.want))
			})
		}
	})

	t.Run("TestTimeout", func(t *testing.T) {
		r := n.rawReq(t, "GET", "/v2/example/timeout", "", "Grpc-Timeout", "10m")
		if r.status != http.StatusGatewayTimeout {
			t.Errorf("resp.StatusCode = %d; want 504: %s", r.status, r.body)
		}
	})

	t.Run("TestInvalidTimeout", func(t *testing.T) {
		r := n.rawReq(t, "GET", "/v2/example/timeout", "", "Grpc-Timeout", "INVALID")
		if r.status != http.StatusBadRequest {
			t.Errorf("resp.StatusCode = %d; want 400: %s", r.status, r.body)
		}
	})

	t.Run("TestPostWithEmptyBody", func(t *testing.T) {
		r := n.rawReq(t, "POST", "/v2/example/postwithemptybody/name", "", "Content-Type", ct)
		if r.status != 200 {
			t.Errorf("response code is %d; want 200: %s", r.status, r.body)
		}
	})

	t.Run("TestRequestQueryParams", func(t *testing.T) {
		form := "optional_string_value=optional-val&repeated_string_value=demo1&repeated_string_value=demo2&string_value=hello-world"
		for _, tc := range []struct{ name, method, ctype, path, body, want string }{
			{"get url query values", "GET", ct,
				"/v1/example/a_bit_of_everything/params/get/foo?double_value=1234.56&bool_value=true&mapped_string_value[map_key]=map_value", "",
				`{"singleNested":{"name":"foo"},"doubleValue":1234.56,"boolValue":true,"mappedStringValue":{"map_key":"map_value"}}`},
			{"get nested enum url parameter", "GET", ct,
				"/v1/example/a_bit_of_everything/params/get/nested_enum/TRUE", "",
				`{"singleNested":{"ok":"TRUE"}}`},
			{"post url query values", "POST", ct,
				"/v1/example/a_bit_of_everything/params/post/hello-world?double_value=1234.56&bool_value=true", `{"name":"foo","amount":100}`,
				`{"singleNested":{"name":"foo","amount":100},"doubleValue":1234.56,"boolValue":true,"stringValue":"hello-world"}`},
			{"post form and url query values", "POST", "application/x-www-form-urlencoded",
				"/v1/example/a_bit_of_everything/params/get/foo?double_value=1234.56&bool_value=true", form,
				`{"singleNested":{"name":"foo"},"doubleValue":1234.56,"boolValue":true,"stringValue":"hello-world",
				  "repeatedStringValue":["demo1","demo2"],"optionalStringValue":"optional-val"}`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := n.rawReq(t, tc.method, tc.path, tc.body, "Content-Type", tc.ctype)
				same(t, answer(t, r, 200, abeMD), msgOf(t, abeMD, tc.want))
			})
		}
	})

	t.Run("TestNestedEnumGetQueryParams", func(t *testing.T) {
		// 1 is DeepEnum.TRUE
		if r := n.rawReq(t, "GET", "/v1/example/a_bit_of_everything/params/get/nested_enum/1", ""); r.status != 200 {
			t.Fatalf("resp.StatusCode = %d; want 200: %s", r.status, r.body)
		}
	})
}
