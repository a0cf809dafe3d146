// Command golint runs internal/golint's checks over the library's
// packages (from the working directory, or the one given) and exits 1
// when any finds something.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/golint"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	root, err := filepath.Abs(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "golint:", err)
		os.Exit(2)
	}
	dirs, err := golint.LibraryDirs(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "golint:", err)
		os.Exit(2)
	}
	n := 0
	for _, dir := range dirs {
		probs, err := golint.CheckDir(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "golint:", err)
			os.Exit(2)
		}
		for _, p := range probs {
			if rel, err := filepath.Rel(root, p.Pos.Filename); err == nil {
				p.Pos.Filename = rel
			}
			fmt.Println(p)
		}
		n += len(probs)
	}
	if n > 0 {
		fmt.Printf("golint: %d problem(s)\n", n)
		os.Exit(1)
	}
	fmt.Printf("golint: %d packages, every goroutine through internal/safego\n", len(dirs))
}
