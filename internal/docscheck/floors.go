package docscheck

import (
	"bufio"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// The floors: ffi/ (the library's exports) sits on top of internal/ and
// qrpc/, so nothing under those imports ffi/, and a package's C code
// compiles with the headers in its own directory only: an include or a
// cgo path flag that leaves the directory reaches into another floor
// (docs/design.md). The go command refuses import cycles, but not these.
var (
	// cgo reads its directives with any white space between the words
	// and an optional build constraint before the colon.
	cgoRe     = regexp.MustCompile(`^\s*(?://\s*)?#cgo\s+([^:]*):(.*)$`)
	includeRe = regexp.MustCompile(`^\s*(?://\s*)?#\s*include\s*([<"])([^>"]*)[>"]`)
	// The flags whose argument is a directory or a file, glued to the
	// flag or as the next word; longest first (-include before -I's
	// lower-case cousins).
	pathFlags = []string{"-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-I", "-L"}
)

// Floors finds the includes, cgo path flags and imports under internal/
// and qrpc/ that leave their package's floor.
func Floors(root string, files []string) []Problem {
	mod := modulePath(root)
	var probs []Problem
	for _, f := range files {
		if !strings.HasPrefix(f, "internal/") && !strings.HasPrefix(f, "qrpc/") {
			continue
		}
		ext := filepath.Ext(f)
		if ext != ".go" && ext != ".c" && ext != ".h" {
			continue
		}
		dir := filepath.Dir(f)
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			probs = append(probs, Problem{File: f, Msg: err.Error()})
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		sc.Buffer(make([]byte, 1<<16), 1<<22)
		for n := 1; sc.Scan(); n++ {
			if msg := lineLeaves(dir, sc.Text()); msg != "" {
				probs = append(probs, Problem{File: f, Line: n, Msg: msg})
			}
		}
		if ext != ".go" || mod == "" {
			continue
		}
		fset := token.NewFileSet()
		af, err := parser.ParseFile(fset, f, b, parser.ImportsOnly)
		if err != nil {
			continue // go vet reports it
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if p == mod+"/ffi" || strings.HasPrefix(p, mod+"/ffi/") {
				probs = append(probs, Problem{File: f, Line: fset.Position(im.Pos()).Line,
					Msg: fmt.Sprintf("imports %s: ffi/ sits above internal/ and qrpc/", p)})
			}
		}
	}
	return probs
}

// lineLeaves says how a line of a file in dir reaches out of it: an
// #include or a cgo directive's path flag; "" when it does not.
func lineLeaves(dir, line string) string {
	if m := includeRe.FindStringSubmatch(line); m != nil {
		if leaves(dir, m[2]) {
			return fmt.Sprintf("#include %s%s leaves %s (a package compiles with the headers in its own directory)", m[1], m[2], dir)
		}
		return ""
	}
	m := cgoRe.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	words := strings.Fields(m[2])
	for i := 0; i < len(words); i++ {
		w := strings.Trim(words[i], `'"`)
		for _, fl := range pathFlags {
			arg, ok := strings.CutPrefix(w, fl)
			if !ok {
				continue
			}
			if arg == "" && i+1 < len(words) {
				i++
				arg = strings.Trim(words[i], `'"`)
			}
			if arg == "" || leaves(dir, arg) {
				return fmt.Sprintf("#cgo %s: %s %s leaves %s (a package compiles with the headers in its own directory)",
					strings.Join(strings.Fields(m[1]), " "), fl, arg, dir)
			}
			break
		}
	}
	return ""
}

// leaves says whether path, as cgo and the compiler read it from a file
// in dir, is outside dir: a relative path and ${SRCDIR} both start
// there, and an absolute path is outside it.
func leaves(dir, path string) bool {
	if rest, ok := strings.CutPrefix(path, "${SRCDIR}"); ok {
		path = strings.TrimPrefix(rest, "/")
	} else if filepath.IsAbs(path) {
		return true
	}
	c := filepath.Clean(filepath.Join(dir, path))
	return c != dir && !strings.HasPrefix(c, dir+"/")
}

// modulePath reads the module's path from go.mod.
func modulePath(root string) string {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(p), `"`)
		}
	}
	return ""
}
