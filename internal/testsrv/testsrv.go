// Package testsrv starts a real qrpc server for tests: QUIC and TLS on
// 127.0.0.1, a certificate from a fresh test CA, and one fixed handler set
// that the Go, C and Lua hosts' tests all call. Only tests import it.
package testsrv

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Server is a listening qrpc server with the handlers below:
//
//	echo   answers with the request's headers and body
//	code   answers code 7, body "seven"
//	sleep  waits the milliseconds in the body (or until cancelled), "slept";
//	       counted when it returns (Slept)
//	greet  answers "Hello <body>!"
//	ev, notify  events, counted per method (see Events)
type Server struct {
	Addr string    // host:port on 127.0.0.1
	CA   *certs.CA // signed the server certificate; clients trust CA.CertPEM

	// events counts per event method. The map is filled before the server
	// listens and never changes after, so only the counters need atomics.
	events map[string]*atomic.Int64
	// slept counts the sleep handlers that returned (see Slept).
	slept atomic.Int64
}

// Options adjust Start. The zero value is what most tests want.
type Options struct {
	// Logger takes the server's log lines; nil keeps qrpc's default
	// (slog.Default), so a failing test shows why the server hung up.
	Logger *slog.Logger
}

// Start starts a Server and closes it when t ends. Any failure to start
// is fatal: a test without its server tests nothing.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	ca, cert, err := certs.NewLocal("testsrv CA")
	if err != nil {
		t.Fatalf("testsrv: certificates: %v", err)
	}
	s := &Server{CA: ca, events: map[string]*atomic.Int64{}}
	srv := qrpc.NewServer(&qrpc.ServerConfig{Logger: o.Logger})
	s.register(srv)
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(cert, nil))
	if err != nil {
		t.Fatalf("testsrv: listen: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	s.Addr = a.String()
	return s
}

// Events returns how many events named method the server has handled.
// Events are one-way: callers poll it until the count they expect arrives.
// Asking for a method with no handler is a bug in the test, not a zero.
func (s *Server) Events(method string) int64 {
	n, ok := s.events[method]
	if !ok {
		panic("testsrv: no event handler named " + method)
	}
	return n.Load()
}

// Slept returns how many sleep handlers have returned: their answers are
// being written. A test that checks a cancelled call's late answer is
// dropped waits for this, then for a few more round trips.
func (s *Server) Slept() int64 { return s.slept.Load() }

func (s *Server) register(srv *qrpc.Server) {
	srv.Handle("echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		resp.Headers, resp.Body = req.Headers, req.Body
	})
	srv.Handle("code", func(_ context.Context, _ *qrpc.Request, resp *qrpc.Response) {
		resp.Code, resp.Body = 7, []byte("seven")
	})
	// sleep honours cancellation so that tests of timeouts and shutdown do
	// not leave handlers running into the next test.
	srv.Handle("sleep", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		ms, _ := strconv.Atoi(string(req.Body))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
		}
		resp.Body = []byte("slept")
		s.slept.Add(1)
	})
	srv.Handle("greet", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		resp.Body = []byte("Hello " + string(req.Body) + "!")
	})
	// Two event names, counted apart, so that an event sent under the wrong
	// name does not pass for the right one.
	for _, m := range []string{"ev", "notify"} {
		n := new(atomic.Int64)
		s.events[m] = n
		srv.HandleEvent(m, func(context.Context, *qrpc.Request) { n.Add(1) })
	}
}
