package docscheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLintFloorCatchesIncludesOfFFI: every way a package under internal/
// or qrpc/ can reach a header or package above its own directory is
// refused, in each spelling cgo and the C preprocessor accept; what stays
// in the package's directory, system headers, and ffi/ reaching down are
// not.
func TestLintFloorCatchesIncludesOfFFI(t *testing.T) {
	const mod = "module github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc\n\ngo 1.26.0\n"
	clean := map[string]string{
		"go.mod": mod,
		"internal/hostq/queue.go": "package hostq\n\n/*\n#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/sub -O2\n#cgo linux LDFLAGS: -ldl\n" +
			"#include <stdlib.h>\n#include <sys/socket.h>\n#include \"qrpc.h\"\n#include \"sub/x.h\"\n*/\nimport \"C\"\n",
		"internal/hostq/hostq.c":  "#include \"qrpc.h\"\n#  include <string.h>\n",
		"qrpc/a.go":               "package qrpc\n\nimport \"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego\"\n\nvar _ = \"ffi/x\" // a string, not an import\n",
		"ffi/testhost/host.c":     "#include \"../../internal/hostq/qrpc.h\"\n",
		"ffi/exports.go":          "package main\n\n// #cgo CFLAGS: -I${SRCDIR}/../internal/hostq\nimport \"C\"\n",
		"internal/hostq/notes.md": "#include \"../../ffi/qrpc.h\" in prose is no include\n",
	}
	root := tree(t, clean)
	if got := run(t, root, Floors); len(got) != 0 {
		t.Fatalf("a tree whose floors hold: %v", got)
	}
	for _, line := range []string{
		"#cgo CFLAGS: -I${SRCDIR}/../../ffi",
		"#cgo linux CFLAGS: -I../../ffi",
		"#cgo linux,amd64 CFLAGS: -I${SRCDIR}/../../ffi",
		"#cgo !windows CPPFLAGS: -I../../ffi",
		"#cgo  CFLAGS:  -I${SRCDIR}/../../ffi",
		"#cgo\tCFLAGS:\t-I\t../../ffi",
		"#cgo CFLAGS: -I ../../ffi",
		"#cgo CFLAGS: -O2 -isystem ../../ffi",
		"#cgo CFLAGS: -isystem${SRCDIR}/../../ffi",
		"#cgo CFLAGS: -iquote ../../ffi",
		"#cgo CFLAGS: -idirafter ../../ffi",
		"#cgo CFLAGS: -include ../../ffi/qrpc.h",
		"#cgo CFLAGS: -I/usr/src/ffi",
		"#cgo LDFLAGS: -L${SRCDIR}/../../ffi",
		"#include <../../ffi/qrpc.h>",
		"#include \"../../ffi/qrpc.h\"",
		"#  include \"../../ffi/qrpc.h\"",
		"# include <../hostq/qrpc.h>",
		"#include \"sub/../../x.h\"",
		"#include \"/usr/src/ffi/qrpc.h\"",
	} {
		for _, f := range []string{"internal/bridge/x.go", "qrpc/x.h"} {
			text := "package bridge\n\n/*\n" + line + "\n*/\nimport \"C\"\n"
			if strings.HasSuffix(f, ".h") {
				text = "\n\n\n" + line + "\n"
			}
			p := filepath.Join(root, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			got := run(t, root, Floors)
			if len(got) != 1 || !strings.HasPrefix(got[0], f+":4: ") {
				t.Errorf("%s in %s: got %v, want one problem on line 4", line, f, got)
			}
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Imports of ffi/, however written (the go command refuses only
	// cycles, and ffi/testhost imports nothing of internal/).
	for _, imp := range []string{
		"import \"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/ffi\"",
		"import q \"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/ffi/testhost\"",
		"import (\n\t_ \"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/ffi\"\n)",
	} {
		p := filepath.Join(root, "internal/bridge/y.go")
		if err := os.WriteFile(p, []byte("package bridge\n\n"+imp+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		got := run(t, root, Floors)
		if len(got) != 1 || !strings.HasPrefix(got[0], "internal/bridge/y.go:") || !strings.Contains(got[0], "imports") {
			t.Errorf("%s: got %v, want one import problem", imp, got)
		}
	}
}
