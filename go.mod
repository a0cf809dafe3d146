module github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc

go 1.26.8

require (
	github.com/bufbuild/protocompile v0.14.1
	github.com/klauspost/compress v1.20.4
	github.com/planetscale/vtprotobuf v0.6.0
	github.com/quic-go/quic-go v0.65.0
	golang.org/x/net v0.56.0
	golang.org/x/sys v0.47.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
