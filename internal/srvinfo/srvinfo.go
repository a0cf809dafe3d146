// Package srvinfo carries, in a qrpc server handler's context, the QUIC
// stream and connection its request came on: the test suites read it to
// see how a client spreads its calls over streams and connections. It is
// internal: handlers of users have no need of transport details.
package srvinfo

import "context"

type key struct{}

type info struct {
	stream int64
	conn   context.Context
}

// With returns ctx carrying the stream id and the connection's context.
func With(ctx context.Context, stream int64, conn context.Context) context.Context {
	return context.WithValue(ctx, key{}, &info{stream: stream, conn: conn})
}

// StreamID returns the QUIC stream a unary handler's request came on.
func StreamID(ctx context.Context) (int64, bool) {
	si, ok := ctx.Value(key{}).(*info)
	if !ok {
		return 0, false
	}
	return si.stream, true
}

// Conn returns the connection's own context from a unary handler's (one
// per stream, derived from it): the same value for every request of one
// connection, to tell connections apart.
func Conn(ctx context.Context) context.Context {
	if si, ok := ctx.Value(key{}).(*info); ok {
		return si.conn
	}
	return ctx
}
