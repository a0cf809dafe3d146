// Package golint holds the repository's own Go checks that gofmt and go
// vet do not make. One so far: every goroutine the library starts, and
// every function it hands to time.AfterFunc, goes through
// internal/safego, so that a panic there is recovered, reported and
// counted instead of ending the nginx worker (see safego). A bare go
// statement or a time.AfterFunc in the library's non-test code fails
// `make lint` with its file and line.
package golint

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Problem is one finding, printed as file:line: message.
type Problem struct {
	Pos token.Position
	Msg string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s", p.Pos.Filename, p.Pos.Line, p.Msg)
}

// Exempt are the packages (import path suffixes) the goroutine check
// leaves alone: safego itself.
var Exempt = []string{"/internal/safego"}

// LibraryDirs lists the directories of this module's packages that the
// library (./ffi) is built from, as `go list -deps` sees them from root,
// without the exempt ones.
func LibraryDirs(root string) ([]string, error) {
	mod, err := goList(root, "-m", "-f", "{{.Path}}")
	if err != nil {
		return nil, err
	}
	module := strings.TrimSpace(mod)
	out, err := goList(root, "-deps", "-f", "{{.ImportPath}}\t{{.Dir}}", "./ffi")
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		path, dir, ok := strings.Cut(line, "\t")
		if !ok || (path != module && !strings.HasPrefix(path, module+"/")) {
			continue
		}
		exempt := false
		for _, e := range Exempt {
			exempt = exempt || strings.HasSuffix(path, e)
		}
		if !exempt {
			dirs = append(dirs, dir)
		}
	}
	sort.Strings(dirs)
	return dirs, nil
}

func goList(root string, args ...string) (string, error) {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, append([]string{"list"}, args...)...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out), nil
}

// CheckDir checks every non-test .go file of dir, whatever its build
// tags (the test-hook files are code of the library's test builds).
func CheckDir(dir string) ([]Problem, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var probs []Problem
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		probs = append(probs, CheckFile(fset, f)...)
	}
	return probs, nil
}

// CheckFile reports the go statements of f and its uses of
// time.AfterFunc (called or not: a function value escapes the check
// just as well), through whatever name f imports package time by.
func CheckFile(fset *token.FileSet, f *ast.File) []Problem {
	timeNames := map[string]bool{}
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "time" {
			name := "time"
			if imp.Name != nil {
				name = imp.Name.Name
			}
			timeNames[name] = true
		}
	}
	var probs []Problem
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			probs = append(probs, Problem{fset.Position(n.Pos()),
				"go statement: start goroutines with safego.Go (a panic there would end the nginx worker)"})
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && timeNames[id.Name] && n.Sel.Name == "AfterFunc" {
				probs = append(probs, Problem{fset.Position(n.Pos()),
					"time.AfterFunc: use safego.AfterFunc (its function runs on a goroutine of its own)"})
			}
		}
		return true
	})
	return probs
}

// Kinds lists the kinds of goroutine f names to internal/safego: the
// string literal each call of Go, Func, AfterFunc, Run, Recover, Inject
// or Report starts with (the label of qrpc_client_panics_total).
func Kinds(f *ast.File) []string {
	safegoName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); strings.HasSuffix(p, "/internal/safego") {
			safegoName = "safego"
			if imp.Name != nil {
				safegoName = imp.Name.Name
			}
		}
	}
	if safegoName == "" {
		return nil
	}
	var kinds []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); !ok || id.Name != safegoName {
			return true
		}
		switch sel.Sel.Name {
		case "Go", "Func", "AfterFunc", "Run", "Recover", "Inject", "Report":
		default:
			return true
		}
		if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if k, err := strconv.Unquote(lit.Value); err == nil {
				kinds = append(kinds, k)
			}
		}
		return true
	})
	return kinds
}
