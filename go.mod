module github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc

go 1.26.8

require (
	github.com/bufbuild/protocompile v0.14.1
	github.com/klauspost/compress v1.20.4
	github.com/planetscale/vtprotobuf v0.6.0
	github.com/quic-go/quic-go v0.65.0
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.49.0
	google.golang.org/genproto/googleapis/api v0.0.0-20261110000943-09e21b237f2c
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
)
