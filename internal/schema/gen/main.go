// Command gen writes lua/resty/ffi/qrpc/schema.lua, the record keys
// (lua/resty/ffi/qrpc/wire_keys.lua, internal/bridge/wire_keys.go) and
// docs/api.md's option tables from internal/schema
// (make schema), or with -check fails when the committed file differs
// or the options and the record keys disagree (make lint).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/schema"
)

func main() {
	check := flag.Bool("check", false, "fail when the committed file differs")
	flag.Parse()
	want := schema.LuaSource()
	generated := []struct {
		path string
		src  []byte
	}{
		{schema.WireLuaPath, schema.WireLuaSource()},
		{schema.WireGoPath, schema.WireGoSource()},
	}
	doc, err := os.ReadFile(schema.DocPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	wantDoc, err := schema.SpliceDoc(string(doc))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *check {
		if errs := schema.CheckWire(schema.Options); len(errs) > 0 {
			fmt.Fprintf(os.Stderr, "internal/schema: the options and the record keys disagree:\n  %s\n", strings.Join(errs, "\n  "))
			os.Exit(1)
		}
		got, err := os.ReadFile(schema.LuaPath)
		if err != nil || !bytes.Equal(got, want) {
			fmt.Fprintf(os.Stderr, "%s differs from internal/schema: run make schema and commit it\n", schema.LuaPath)
			os.Exit(1)
		}
		for _, g := range generated {
			got, err := os.ReadFile(g.path)
			if err != nil || !bytes.Equal(got, g.src) {
				fmt.Fprintf(os.Stderr, "%s differs from internal/schema: run make schema and commit it\n", g.path)
				os.Exit(1)
			}
		}
		if wantDoc != string(doc) {
			fmt.Fprintf(os.Stderr, "%s: the option tables differ from internal/schema: run make schema and commit it\n", schema.DocPath)
			os.Exit(1)
		}
		return
	}
	if err := os.WriteFile(schema.LuaPath, want, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, g := range generated {
		if err := os.WriteFile(g.path, g.src, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := os.WriteFile(schema.DocPath, []byte(wantDoc), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
