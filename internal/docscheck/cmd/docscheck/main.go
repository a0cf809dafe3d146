// Command docscheck runs the documentation checks of internal/docscheck
// over the repository (the working directory, or the one given) and
// exits 1 when any fails.
package main

import (
	"fmt"
	"os"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/docscheck"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	files, err := docscheck.Files(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docscheck:", err)
		os.Exit(2)
	}
	var probs []docscheck.Problem
	probs = append(probs, docscheck.ReadmeLength(root)...)
	probs = append(probs, docscheck.Links(root, files)...)
	probs = append(probs, docscheck.History(root, files)...)
	probs = append(probs, docscheck.API(root)...)
	probs = append(probs, docscheck.Floors(root, files)...)
	for _, p := range probs {
		fmt.Println(p)
	}
	if len(probs) > 0 {
		fmt.Printf("docscheck: %d problem(s)\n", len(probs))
		os.Exit(1)
	}
	fmt.Printf("docscheck: %d files, README, links, history, API names and floors all right\n", len(files))
}
