package nginx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/api/httpbody"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// filesServer plays nginx/testdata/gateway/files.proto's Files service
// over qrpc, with a store of files by name: Download answers a file as a
// google.api.HttpBody (code 5 for a missing one; "broken" answers bytes
// that are not a message), Upload stores the request's HttpBody as
// "upload", Put the field file of its request under its name, and
// Export answers a Report whose field file is the named file.
type filesServer struct {
	mu    sync.Mutex
	files map[string]*httpbody.HttpBody
	puts  []protoreflect.Message // the PutRequests, as the server got them
	calls int                    // the Upload and Put calls that reached the server
}

// storeCalls is how many Upload and Put calls reached the server.
func (s *filesServer) storeCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *filesServer) stored(name string) *httpbody.HttpBody {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.files[name]
}

func startFilesServer(t *testing.T, fd protoreflect.FileDescriptor, files map[string]*httpbody.HttpBody) (*filesServer, string) {
	t.Helper()
	s := &filesServer{files: files}
	msg := func(name string) *dynamicpb.Message {
		return dynamicpb.NewMessage(fd.Messages().ByName(protoreflect.Name(name)))
	}
	stored := func(name, note string, hb *httpbody.HttpBody) []byte {
		sum := sha256.Sum256(hb.GetData())
		m := msg("Stored")
		m.Set(field(m, "name"), protoreflect.ValueOfString(name))
		m.Set(field(m, "content_type"), protoreflect.ValueOfString(hb.GetContentType()))
		m.Set(field(m, "size"), protoreflect.ValueOfInt64(int64(len(hb.GetData()))))
		m.Set(field(m, "sha256"), protoreflect.ValueOfString(hex.EncodeToString(sum[:])))
		m.Set(field(m, "note"), protoreflect.ValueOfString(note))
		b, _ := proto.Marshal(m)
		return b
	}
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	srv.Handle("Download", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		ref := msg("FileRef")
		if err := proto.Unmarshal(req.Body, ref); err != nil {
			resp.Code, resp.Body = 3, []byte(err.Error())
			return
		}
		name := ref.Get(field(ref, "name")).String()
		if name == "broken" {
			resp.Body = []byte{0x12, 0x7f, 'x'} // data: 127 bytes announced, 1 there
			return
		}
		hb := s.stored(name)
		if hb == nil {
			resp.Code, resp.Body = 5, []byte("no file "+name)
			return
		}
		resp.Body, _ = proto.Marshal(hb)
	})
	srv.Handle("Upload", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.mu.Lock()
		s.calls++
		s.mu.Unlock()
		hb := &httpbody.HttpBody{}
		if err := proto.Unmarshal(req.Body, hb); err != nil {
			resp.Code, resp.Body = 3, []byte(err.Error())
			return
		}
		s.mu.Lock()
		s.files["upload"] = hb
		s.mu.Unlock()
		resp.Body = stored("upload", "", hb)
	})
	srv.Handle("Put", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.mu.Lock()
		s.calls++
		s.mu.Unlock()
		in := msg("PutRequest")
		if err := proto.Unmarshal(req.Body, in); err != nil {
			resp.Code, resp.Body = 3, []byte(err.Error())
			return
		}
		hb := &httpbody.HttpBody{}
		b, _ := proto.Marshal(in.Get(field(in, "file")).Message().Interface())
		if err := proto.Unmarshal(b, hb); err != nil {
			resp.Code, resp.Body = 3, []byte(err.Error())
			return
		}
		name := in.Get(field(in, "name")).String()
		s.mu.Lock()
		s.files[name] = hb
		s.puts = append(s.puts, in)
		s.mu.Unlock()
		resp.Body = stored(name, in.Get(field(in, "note")).String(), hb)
	})
	srv.Handle("Export", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		ref := msg("FileRef")
		if err := proto.Unmarshal(req.Body, ref); err != nil {
			resp.Code, resp.Body = 3, []byte(err.Error())
			return
		}
		name := ref.Get(field(ref, "name")).String()
		hb := s.stored(name)
		if hb == nil {
			resp.Code, resp.Body = 5, []byte("no file "+name)
			return
		}
		rep := msg("Report")
		rep.Set(field(rep, "name"), protoreflect.ValueOfString(name))
		rep.Set(field(rep, "rows"), protoreflect.ValueOfInt32(2))
		b, _ := proto.Marshal(rep)
		// the file field in two pieces, which a parser merges: content_type
		// in the first, data in the second
		for _, part := range []*httpbody.HttpBody{{ContentType: hb.GetContentType()}, {Data: hb.GetData()}} {
			pb, _ := proto.Marshal(part)
			b = append(b, 7<<3|2)
			b = append(b, protoVarint(len(pb))...)
			b = append(b, pb...)
		}
		resp.Body = b
	})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(serverTLSCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return s, a.String()
}

func protoVarint(n int) []byte {
	var b []byte
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

// testPNG is a real PNG image whose bytes take every value from 0 to 255.
func testPNG(t *testing.T) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, 64, 64))
	rnd := rand.New(rand.NewSource(7))
	for i := range img.Pix {
		img.Pix[i] = byte(rnd.Intn(256))
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	seen := map[byte]bool{}
	for _, c := range buf.Bytes() {
		seen[c] = true
	}
	if len(seen) != 256 {
		t.Fatalf("the test image has %d byte values, want 256", len(seen))
	}
	return buf.Bytes()
}

// TestGatewayHttpBody: methods whose request or answer is a
// google.api.HttpBody carry raw bytes with their own content type, through
// a real nginx to a real qrpc server: a PNG and a CSV come back with their
// Content-Type and every byte unchanged (also as a response_body field);
// an upload is the request's bytes and Content-Type (the whole request,
// or the field body names, the other fields from the path and the query
// string), bounded by max_body; the OpenAPI document says binary.
func TestGatewayHttpBody(t *testing.T) {
	dir := gatewayDir(t)
	b, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "testdata", "gateway", "files.proto"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "files.proto"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	fd := compileProto(t, []string{dir}, "files.proto")
	pngBytes := testPNG(t)
	csv := "id,name,price\r\n1,\"Gjøvik, Norway\",9.50\r\n2,\"a \"\"quoted\"\" name\",0\r\n"
	srv, addr := startFilesServer(t, fd, map[string]*httpbody.HttpBody{
		"logo.png":   {ContentType: "image/png", Data: pngBytes},
		"report.csv": {ContentType: "text/csv; charset=utf-8", Data: []byte(csv)},
		"blob":       {Data: []byte{0, 1, 2, 255}},
		"empty":      {ContentType: "text/plain"},
		"evil":       {ContentType: "text/plain\r\nX-Injected: 1", Data: []byte("x")},
	})
	const maxBody = 256 << 10
	n := startNginx(t, ngxConf{
		Workers: 1,
		InitByLua: lines(
			`        local qrpc = require "resty.ffi.qrpc"`,
			`        assert(qrpc.configure{ lib = "`+libPath+`", socket_dir = ngx.config.prefix() .. "run" })`,
			`        local gateway = require "resty.ffi.qrpc.gateway"`,
			`        local qt = require "qtest"`,
			`        package.loaded.gw = assert(gateway.new{ upstream = qt.files_addr,`,
			`            protos = { files = { "files.proto" }, import_paths = { qt.proto_dir } },`,
			fmt.Sprintf(`            codes = "grpc", max_body = %d, openapi = true, opts = qt.opts({ timeout = 10000 }) })`, maxBody),
		),
		HTTP:   `    client_max_body_size 1m;`,
		Extra:  map[string]string{"files_addr": addr, "proto_dir": dir},
		Server: `        location / { content_by_lua_block { package.loaded.gw:serve() } }`,
	})

	// raw checks an answer's status, Content-Type and bytes
	raw := func(t *testing.T, what string, r gwResp, ct string, want []byte) {
		t.Helper()
		if r.status != 200 {
			t.Fatalf("%s: status %d: %s", what, r.status, r.body)
		}
		if got := r.hdr.Get("Content-Type"); got != ct {
			t.Errorf("%s: Content-Type %q, want %q", what, got, ct)
		}
		if !bytes.Equal([]byte(r.body), want) {
			t.Errorf("%s: %d bytes differ from the %d sent (first %.40q)", what, len(r.body), len(want), r.body)
		}
	}
	storedOf := func(t *testing.T, r gwResp) map[string]any {
		t.Helper()
		var m map[string]any
		if r.status != 200 || json.Unmarshal([]byte(r.body), &m) != nil {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return m
	}
	sum := func(b []byte) string {
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}

	t.Run("download", func(t *testing.T) {
		r := n.rawReq(t, "GET", "/v1/files/logo.png", "")
		raw(t, "PNG", r, "image/png", pngBytes)
		if _, err := png.Decode(strings.NewReader(r.body)); err != nil {
			t.Errorf("the PNG does not decode: %v", err)
		}
		raw(t, "CSV", n.rawReq(t, "GET", "/v1/files/report.csv", ""), "text/csv; charset=utf-8", []byte(csv))
		// an Accept of protobuf changes nothing: the data is the answer
		raw(t, "PNG, Accept protobuf", n.rawReq(t, "GET", "/v1/files/logo.png", "", "Accept", "application/x-protobuf"),
			"image/png", pngBytes)
		raw(t, "no content_type", n.rawReq(t, "GET", "/v1/files/blob", ""), "application/octet-stream", []byte{0, 1, 2, 255})
		raw(t, "no data", n.rawReq(t, "GET", "/v1/files/empty", ""), "text/plain", nil)
		// the response_body field, sent in two pieces that a parser merges
		raw(t, "response_body HttpBody", n.rawReq(t, "GET", "/v1/reports/report.csv", ""), "text/csv; charset=utf-8", []byte(csv))
		r = n.rawReq(t, "HEAD", "/v1/files/logo.png", "")
		if r.status != 200 || r.hdr.Get("Content-Type") != "image/png" || r.body != "" {
			t.Errorf("HEAD: %d %q %q", r.status, r.hdr.Get("Content-Type"), r.body)
		}
	})

	t.Run("download errors", func(t *testing.T) {
		expectError(t, "a missing file", n.rawReq(t, "GET", "/v1/files/nope", ""), 404, "no file nope")
		expectError(t, "not a message", n.rawReq(t, "GET", "/v1/files/broken", ""), 502,
			"bad response: google.api.HttpBody: cannot parse invalid wire-format data")
		r := n.rawReq(t, "GET", "/v1/files/evil", "")
		expectError(t, "a header in content_type", r, 502, "bad response: google.api.HttpBody: a control character in content_type")
		if r.hdr.Get("X-Injected") != "" {
			t.Error("content_type's CRLF made a header")
		}
	})

	t.Run("upload", func(t *testing.T) {
		m := storedOf(t, n.rawReq(t, "POST", "/v1/files", string(pngBytes), "Content-Type", "image/png"))
		if m["contentType"] != "image/png" || m["size"] != fmt.Sprint(len(pngBytes)) || m["sha256"] != sum(pngBytes) {
			t.Errorf("stored %v, want image/png, %d bytes, sha256 %s", m, len(pngBytes), sum(pngBytes))
		}
		raw(t, "the upload read back", n.rawReq(t, "GET", "/v1/files/upload", ""), "image/png", pngBytes)

		// up to max_body: every byte value, past nginx's in-memory body
		// buffer (the body is read from its temporary file)
		big := make([]byte, maxBody)
		rand.New(rand.NewSource(1)).Read(big)
		m = storedOf(t, n.rawReq(t, "POST", "/v1/files", string(big), "Content-Type", "application/octet-stream"))
		if m["size"] != fmt.Sprint(maxBody) || m["sha256"] != sum(big) {
			t.Errorf("stored %v, want %d bytes, sha256 %s", m, maxBody, sum(big))
		}
		expectError(t, "over max_body", n.rawReq(t, "POST", "/v1/files", string(big)+"x", "Content-Type", "application/octet-stream"),
			413, fmt.Sprintf("request body larger than %d bytes", maxBody))

		// a path variable sets a field of the HttpBody over the request's
		m = storedOf(t, n.rawReq(t, "POST", "/v1/typed/text/csv", csv, "Content-Type", "application/octet-stream"))
		if m["contentType"] != "text/csv" || m["sha256"] != sum([]byte(csv)) {
			t.Errorf("stored %v, want text/csv and the CSV's bytes", m)
		}

		// no body, no Content-Type: an empty HttpBody
		m = storedOf(t, n.rawReq(t, "POST", "/v1/files", ""))
		if m["size"] != nil || m["contentType"] != nil {
			t.Errorf("an empty upload stored %v", m)
		}
	})

	t.Run("upload into a field", func(t *testing.T) {
		m := storedOf(t, n.rawReq(t, "PUT", "/v1/files/notes.csv?note=first%20draft", csv, "Content-Type", "text/csv; charset=utf-8"))
		if m["name"] != "notes.csv" || m["note"] != "first draft" || m["contentType"] != "text/csv; charset=utf-8" || m["sha256"] != sum([]byte(csv)) {
			t.Errorf("stored %v", m)
		}
		raw(t, "the file read back", n.rawReq(t, "GET", "/v1/files/notes.csv", ""), "text/csv; charset=utf-8", []byte(csv))
		// a form's type is the file's, not fields to read
		m = storedOf(t, n.rawReq(t, "PUT", "/v1/files/form.txt", "a=1&b=2", "Content-Type", "application/x-www-form-urlencoded"))
		if m["contentType"] != "application/x-www-form-urlencoded" || m["size"] != "7" {
			t.Errorf("stored %v", m)
		}
		if hb := srv.stored("form.txt"); hb == nil || string(hb.GetData()) != "a=1&b=2" {
			t.Errorf("the server stored %v", hb)
		}
	})

	// A Content-Type that is not UTF-8 (an ISO-8859-1 parameter) cannot be
	// an HttpBody's content_type, a proto3 string: the gateway refuses it
	// with a 400 in its own words, whether the HttpBody is the whole
	// request or the field body names, and no call reaches the server
	// (whose parser would refuse the message as a whole).
	t.Run("upload with a Content-Type that is not UTF-8", func(t *testing.T) {
		const ct = "text/plain; name=caf\xe9"
		for _, c := range []struct{ what, method, path string }{
			{"the whole request", "POST", "/v1/files"},
			{"the field body names", "PUT", "/v1/files/latin1.txt"},
		} {
			before := srv.storeCalls()
			r := n.rawReq(t, c.method, c.path, "hello", "Content-Type", ct)
			expectError(t, c.what, r, 400, "bad message: ", "content_type", "invalid UTF-8")
			if got := srv.storeCalls() - before; got != 0 {
				t.Errorf("%s: %d call(s) reached the server with content_type %q", c.what, got, ct)
			}
		}
	})

	t.Run("openapi", func(t *testing.T) {
		r := n.rawReq(t, "GET", "/openapi.json", "")
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		validateOpenAPI(t, []byte(r.body))
		redoclyLint(t, []byte(r.body))
		var doc struct {
			Paths map[string]map[string]struct {
				RequestBody *struct {
					Content map[string]json.RawMessage `json:"content"`
				} `json:"requestBody"`
				Parameters []struct {
					Name string `json:"name"`
					In   string `json:"in"`
				} `json:"parameters"`
				Responses map[string]struct {
					Content map[string]json.RawMessage `json:"content"`
				} `json:"responses"`
			} `json:"paths"`
		}
		if err := json.Unmarshal([]byte(r.body), &doc); err != nil {
			t.Fatal(err)
		}
		const bin = `{"schema":{"type":"string","format":"binary"}}`
		for _, c := range []struct {
			path, verb string
			req, resp  bool
		}{
			{"/v1/files/{name}", "get", false, true},
			{"/v1/files", "post", true, false},
			{"/v1/files/{name}", "put", true, false},
			{"/v1/reports/{name}", "get", false, true},
		} {
			op, ok := doc.Paths[c.path][c.verb]
			if !ok {
				t.Errorf("no %s %s in the document", c.verb, c.path)
				continue
			}
			if c.req && (op.RequestBody == nil || len(op.RequestBody.Content) != 1 || !jsonEqual(string(op.RequestBody.Content["*/*"]), bin)) {
				t.Errorf("%s %s: requestBody %s, want */* binary", c.verb, c.path, func() any {
					if op.RequestBody == nil {
						return "none"
					}
					return op.RequestBody.Content
				}())
			}
			resp := op.Responses["200"].Content
			if c.resp != (len(resp) == 1 && jsonEqual(string(resp["*/*"]), bin)) {
				t.Errorf("%s %s: 200 content %s", c.verb, c.path, resp)
			}
		}
		var params []string
		for _, p := range doc.Paths["/v1/files/{name}"]["put"].Parameters {
			params = append(params, p.In+":"+p.Name)
		}
		if strings.Join(params, " ") != "path:name query:note" {
			t.Errorf("PUT parameters %v, want the path's name and the query's note (file is the body)", params)
		}
	})
}
