package main

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// The protobuf methods of demo/proto/greeter.proto. They use the code
// protoc-gen-go generated, as a real service would: what Lua sends is
// checked against an implementation that shares nothing with ours.
func (d *demo) registerProto(s *qrpc.Server) {
	s.Handle("SayHello", d.sayHello)
	s.Handle("EchoAllKinds", d.echoAllKinds)
}

// sayHello: HelloRequest -> HelloReply{message: "Hello <name>!"}.
func (d *demo) sayHello(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
	d.calls.Add(1)
	var in demopb.HelloRequest
	if err := proto.Unmarshal(req.Body, &in); err != nil {
		resp.Code = codeBadRequest
		resp.Body = []byte(fmt.Sprintf("SayHello: body is not a demo.HelloRequest: %v", err))
		return
	}
	name := strings.TrimSpace(in.GetName())
	if name == "" {
		name = "world"
	}
	out, err := proto.Marshal(&demopb.HelloReply{Message: "Hello " + name + "!"})
	if err != nil {
		resp.Code = codeBadRequest
		resp.Body = []byte(fmt.Sprintf("SayHello: %v", err))
		return
	}
	resp.Body = out
}

// echoAllKinds decodes a demo.AllKinds and answers with it re-encoded
// (deterministically), so that a round trip from Lua passes through the
// generated code both ways.
func (d *demo) echoAllKinds(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
	d.calls.Add(1)
	var m demopb.AllKinds
	if err := proto.Unmarshal(req.Body, &m); err != nil {
		resp.Code = codeBadRequest
		resp.Body = []byte(fmt.Sprintf("EchoAllKinds: body is not a demo.AllKinds: %v", err))
		return
	}
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(&m)
	if err != nil {
		resp.Code = codeBadRequest
		resp.Body = []byte(fmt.Sprintf("EchoAllKinds: %v", err))
		return
	}
	resp.Body = out
}
