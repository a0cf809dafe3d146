package main

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

func TestProtoMethods(t *testing.T) {
	dir := t.TempDir()
	in := startDemo(t, dir)
	c, err := dial(t, in.addr, &qrpc.Config{CAPEM: readFile(t, dir, fileCA)})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"nginx": "Hello nginx!", "": "Hello world!"} {
		body, err := proto.Marshal(&demopb.HelloRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		r := unary(t, c, "SayHello", string(body))
		var reply demopb.HelloReply
		if r.Code != 0 || proto.Unmarshal(r.Body, &reply) != nil || reply.Message != want {
			t.Fatalf("SayHello(%q) = %d %q", name, r.Code, r.Body)
		}
	}
	if r := unary(t, c, "SayHello", "\xff"); r.Code != codeBadRequest || !strings.Contains(string(r.Body), "not a demo.HelloRequest") {
		t.Fatalf("SayHello(garbage) = %d %q", r.Code, r.Body)
	}

	// EchoAllKinds answers with the message it got, encoded deterministically.
	m := &demopb.AllKinds{I64: -1, Tags: []string{"a"}, Counts: map[string]int64{"b": 2, "a": 1}, Choice: &demopb.AllKinds_ChoiceNum{ChoiceNum: 0}}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	r := unary(t, c, "EchoAllKinds", string(body))
	if r.Code != 0 || string(r.Body) != string(body) {
		t.Fatalf("EchoAllKinds = %d %x, want %x", r.Code, r.Body, body)
	}
	if r := unary(t, c, "EchoAllKinds", "\x0a"); r.Code != codeBadRequest {
		t.Fatalf("EchoAllKinds(garbage) = %d %q", r.Code, r.Body)
	}
}
