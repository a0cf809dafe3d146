// Package qrpc is a client and a server of qrpc, an RPC protocol over
// QUIC (TLS 1.3, ALPN "qrpc"), wire-compatible with the reference
// implementation github.com/XeshSufferer/qrpc.
//
// A frame is a 4-byte big-endian length, a flag byte (request, response,
// event, and their zstd-compressed forms) and a protobuf Request or
// Response. Many calls share a stream; responses are matched by request
// id.
//
// The client side:
//
//   - Dial returns a Client for one server: a QUIC connection
//     (re-dialled in the background with gRPC's backoff when lost) with
//     Config.Streams streams; Unary calls and Event sends are safe for
//     concurrent use.
//   - DialPool returns a Pool for several servers or a DNS name: balancing
//     (round robin, least in flight, rendezvous hashing), passive and
//     active health, failover and retries, re-resolution.
//   - Errors carry a stable word and reason: DialError for a refused or
//     failed dial, ErrTimeout, ErrClosed, ErrConnLost and the others of
//     errors.go; the Reason* constants (and Reasons) give the vocabulary
//     that the Lua module and the metrics use.
//
// The server side: NewServer, Handle and HandleEvent to register methods,
// Listen, ListenAndServe or ServePacketConn to serve, Shutdown to drain.
// An unknown method is answered with CodeUnknownMethod and a panicking
// handler with CodeInternal; the stream lives on.
//
// Config and PoolConfig document each field's default; the zero value
// works. This package has no cgo: the nginx module reaches it through
// internal/bridge and the cgo package ffi.
package qrpc
