package bridge_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge/cmdtest"
)

// The decoding of qrpc_cmd_t into a bridge.Command (the layout against
// qrpc.h is internal/hostq's test: it needs the C compiler).

func TestDecodeCmd(t *testing.T) {
	good := cmdtest.Unary(3, "greet", "hello", "x-id", "7")
	var cmd bridge.Command
	if err := bridge.DecodeCmd(good, &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.Op != bridge.OpUnary || cmd.Conn != 3 || cmd.CallID != 7 || string(cmd.Method) != "greet" || string(cmd.Body) != "hello" || cmd.NHdrs != 2 {
		t.Fatalf("decoded %+v", cmd)
	}
	// The views alias the caller's memory: no copy.
	if unsafe.Pointer(&cmd.Body[0]) != good.Body {
		t.Fatal("body was copied")
	}
	if err := cmd.Check(); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		mod  func(c *bridge.CmdABI)
		want string
	}{
		{"version", func(c *bridge.CmdABI) { c.Version = 9 }, "version 9"},
		// a Lua module older than the result blob's attempts word
		{"older version", func(c *bridge.CmdABI) { c.Version = 3 }, "version 3, this library speaks 5"},
		{"null with length", func(c *bridge.CmdABI) { c.Body, c.BodyLen = nil, 5 }, "body: NULL pointer with length 5"},
		{"huge length", func(c *bridge.CmdABI) { c.BodyLen = 1 << 40 }, "body: length"},
		{"null method", func(c *bridge.CmdABI) { c.Method = nil }, "method: NULL pointer"},
		{"vm", func(c *bridge.CmdABI) { c.VM = bridge.MaxVMs }, "vm must be below 8, got 8"},
		{"null opts", func(c *bridge.CmdABI) { c.OptsLen = 3 }, "opts: NULL pointer with length 3"},
		{"null hash key", func(c *bridge.CmdABI) { c.HashKeyLen = 3 }, "hash_key: NULL pointer with length 3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := *good
			tc.mod(&c)
			err := bridge.DecodeCmd(&c, &cmd)
			if err == nil || !errors.Is(err, bridge.ErrBadCommand) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a bad command error containing %q", err, tc.want)
			}
		})
	}
	if err := bridge.DecodeCmd(nil, &cmd); err == nil {
		t.Fatal("NULL command accepted")
	}
}

func TestDecodeVersion2(t *testing.T) {
	c := cmdtest.Unary(3, "greet", "{}")
	c.Retries, c.Flags = 2, bridge.FlagDiscardUnknown
	c.HashKey, c.HashKeyLen = cmdtest.Ptr([]byte("user-42"))
	c.ReqType, c.ReqTypeLen = cmdtest.Ptr([]byte("pkg.Req"))
	c.RespType, c.RespTypeLen = cmdtest.Ptr([]byte("pkg.Resp"))
	c.Opts, c.OptsLen = cmdtest.Ptr([]byte("k=v\n"))
	var cmd bridge.Command
	if err := bridge.DecodeCmd(c, &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.Retries != 2 || cmd.Flags != bridge.FlagDiscardUnknown || string(cmd.HashKey) != "user-42" ||
		string(cmd.ReqType) != "pkg.Req" || string(cmd.RespType) != "pkg.Resp" || string(cmd.Opts) != "k=v\n" {
		t.Fatalf("decoded %+v", cmd)
	}
}

func TestDecodeConnect(t *testing.T) {
	c := &bridge.CmdABI{Version: bridge.CmdVersion, Op: bridge.OpConnect, TimeoutMS: 1500, Conns: 2, Streams: 8, IdleTimeoutMS: 9000, MaxFrameSize: 1 << 20, Insecure: 1}
	c.Addr, c.AddrLen = cmdtest.Ptr([]byte("127.0.0.1:9"))
	c.ServerName, c.ServerNameLen = cmdtest.Ptr([]byte("qrpc.example"))
	c.CA, c.CALen = cmdtest.Ptr([]byte("CA PEM"))
	c.Cert, c.CertLen = cmdtest.Ptr([]byte("CERT"))
	c.Key, c.KeyLen = cmdtest.Ptr([]byte("KEY"))
	c.Pins, c.PinsLen = cmdtest.Ptr(bytes.Repeat([]byte{0xab}, 64))
	var cmd bridge.Command
	if err := bridge.DecodeCmd(c, &cmd); err != nil {
		t.Fatal(err)
	}
	if string(cmd.Addr) != "127.0.0.1:9" || string(cmd.ServerName) != "qrpc.example" || string(cmd.CA) != "CA PEM" ||
		string(cmd.Cert) != "CERT" || string(cmd.Key) != "KEY" || len(cmd.Pins) != 64 || !cmd.Insecure ||
		cmd.Conns != 2 || cmd.Streams != 8 || cmd.TimeoutMS != 1500 || cmd.IdleTimeoutMS != 9000 || cmd.MaxFrameSize != 1<<20 {
		t.Fatalf("decoded %+v", cmd)
	}
	// Connect-only fields are not read for other ops.
	c.Op = bridge.OpEcho
	if err := bridge.DecodeCmd(c, &cmd); err != nil || cmd.Addr != nil || cmd.Conns != 0 {
		t.Fatalf("echo decoded connect fields: %v %+v", err, cmd)
	}
}
