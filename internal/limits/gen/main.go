// Command gen writes lua/resty/ffi/qrpc/limits.lua from internal/limits
// (make limits), or with -check fails when the committed file differs
// (make lint).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
)

func main() {
	check := flag.Bool("check", false, "fail when the committed file differs")
	flag.Parse()
	want := limits.LuaSource()
	if *check {
		if err := limits.CheckDefaults("."); err != nil {
			fmt.Fprintf(os.Stderr, "internal/limits: %v\n", err)
			os.Exit(1)
		}
		got, err := os.ReadFile(limits.LuaPath)
		if err != nil || !bytes.Equal(got, want) {
			fmt.Fprintf(os.Stderr, "%s differs from internal/limits: run make limits and commit it\n", limits.LuaPath)
			os.Exit(1)
		}
		return
	}
	if err := os.WriteFile(limits.LuaPath, want, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
