//go:build tools

// Package tools pins the protoc plugins that `make proto` runs, so that the
// generated code is reproducible from go.mod alone.
package tools

import (
	_ "github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
)
