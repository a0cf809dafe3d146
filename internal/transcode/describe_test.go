package transcode

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

func TestDescribe(t *testing.T) {
	r := NewRegistry()
	dir, err := filepath.Abs("../../nginx/testdata/gateway")
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Describe(filepath.Join(dir, "shop.proto"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var s Schema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Services) != 1 || s.Services[0].Name != "gwtest.Shop" || s.Services[0].Comment != "Shop sells items from shelves." {
		t.Fatalf("services: %s", b)
	}
	rules := map[string][]*Rule{}
	for _, m := range s.Services[0].Methods {
		rules[m.Name] = m.HTTP
	}
	if g := rules["GetItem"]; len(g) != 2 || g[0].Method != "GET" || g[0].Path != "/v1/items/{id}" || g[1].Path != "/v1/shelves/{shelf}/items/{id}" {
		t.Errorf("GetItem: %+v", g)
	}
	if g := rules["ListItems"]; len(g) != 1 || g[0].ResponseBody != "items" {
		t.Errorf("ListItems: %+v", g)
	}
	if g := rules["UpdateItem"]; len(g) != 1 || g[0].Method != "PATCH" || g[0].Body != "item" {
		t.Errorf("UpdateItem: %+v", g)
	}
	if g := rules["Search"]; len(g) != 1 || g[0].Method != "SEARCH" || g[0].Path != "/v1/files" || g[0].Body != "*" {
		t.Errorf("Search: %+v", g)
	}
	if g := rules["Echo"]; len(g) != 4 {
		t.Errorf("Echo: %+v", g)
	}
	if g := rules["Internal"]; len(g) != 0 {
		t.Errorf("Internal: %+v", g)
	}
	k := s.Messages["gwtest.Kinds"]
	if k == nil {
		t.Fatalf("no Kinds: %s", b)
	}
	byName := map[string]*Field{}
	for _, f := range k.Fields {
		byName[f.Name] = f
	}
	if f := byName["by_num"]; f == nil || !f.Map || f.Key != "int32" || f.Kind != "message" || f.Type != "gwtest.Kinds.Nested" || f.Number != 15 {
		t.Errorf("by_num: %+v", f)
	}
	if f := byName["colors"]; f == nil || !f.Repeated || f.Kind != "enum" || f.Type != "gwtest.Color" {
		t.Errorf("colors: %+v", f)
	}
	if f := byName["maybe"]; f == nil || !f.Optional || f.Oneof != "" {
		t.Errorf("maybe: %+v", f)
	}
	if s.Messages["gwtest.Item"].Fields[0].Comment != "Resource name: shelves/{shelf}/items/{id}." {
		t.Errorf("comment: %+v", s.Messages["gwtest.Item"].Fields[0])
	}
	if e := s.Enums["gwtest.Color"]; e == nil || len(e.Values) != 3 || e.Values[1] != "COLOR_RED" {
		t.Errorf("enum: %+v", e)
	}
	if _, ok := s.Messages["google.protobuf.Timestamp"]; !ok {
		t.Errorf("no Timestamp")
	}
}

// google/api/httpbody.proto is built in, as the well-known types are:
// a file imports it with no file on disk, and google.api.HttpBody is
// described field by field (the gateway reads its data and content_type).
func TestDescribeHttpBody(t *testing.T) {
	dir := writeFiles(t, map[string]string{"h.proto": `syntax = "proto3"; package h;
import "google/api/httpbody.proto";
service S { rpc Get(In) returns (google.api.HttpBody); }
message In { string id = 1; google.api.HttpBody file = 7; }`})
	b, err := NewRegistry().Describe(filepath.Join(dir, "h.proto"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var s Schema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	hb := s.Messages["google.api.HttpBody"]
	if hb == nil || len(hb.Fields) != 3 {
		t.Fatalf("google.api.HttpBody: %s", b)
	}
	for i, want := range []Field{{Name: "content_type", Number: 1, Kind: "string"}, {Name: "data", Number: 2, Kind: "bytes"}} {
		if f := hb.Fields[i]; f.Name != want.Name || f.Number != want.Number || f.Kind != want.Kind {
			t.Errorf("field %d: %+v, want %+v", i, f, want)
		}
	}
	if f := s.Messages["h.In"].Fields[1]; f.Type != "google.api.HttpBody" || f.Number != 7 {
		t.Errorf("h.In.file: %+v", f)
	}
}
