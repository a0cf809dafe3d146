# lua-resty-ffi-qrpc
GO      ?= go
PREFIX  ?= /usr/local
BIN     := .bin

.PHONY: all proto
all: libffi_qrpc.so

# Regenerates qrpc/qrpcpb from proto/qrpc.proto with the plugin versions pinned in go.mod.
proto:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o $(BIN)/protoc-gen-go-vtproto github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto
	protoc -I proto \
	  --plugin=protoc-gen-go=$(BIN)/protoc-gen-go \
	  --plugin=protoc-gen-go-vtproto=$(BIN)/protoc-gen-go-vtproto \
	  --go_out=. --go_opt=module=github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc \
	  --go-vtproto_out=. --go-vtproto_opt=module=github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc \
	  --go-vtproto_opt=features=marshal+unmarshal+unmarshal_unsafe+size+equal+clone \
	  proto/qrpc.proto
