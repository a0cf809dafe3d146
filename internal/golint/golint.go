// Package golint holds the repository's own Go checks that gofmt and go
// vet do not make. One so far: every goroutine the library starts, and
// every function it hands to another goroutine (time.AfterFunc,
// context.AfterFunc, runtime.AddCleanup, runtime.SetFinalizer), goes
// through internal/safego, so that a panic there is recovered, reported
// and counted instead of ending the nginx worker (see safego). A bare go
// statement, a Go method but safego's (sync.WaitGroup.Go), or one of
// those functions in the library's non-test code fails `make lint` with
// its file and line, unless the line says why it may
// ("//golint:goroutine <reason>").
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
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return nil, err
		}
		probs = append(probs, CheckFile(fset, f)...)
	}
	return probs, nil
}

// starters are the package-level functions that run code on a goroutine
// of their own (or the garbage collector's), by the import path of their
// package.
var starters = map[string]map[string]string{
	"time":    {"AfterFunc": "time.AfterFunc: use safego.AfterFunc (its function runs on a goroutine of its own)"},
	"context": {"AfterFunc": "context.AfterFunc: wrap its function with safego.Func (it runs on a goroutine of its own)"},
	"runtime": {
		"AddCleanup":   "runtime.AddCleanup: its function runs on the cleanup goroutine, where a panic ends the process",
		"SetFinalizer": "runtime.SetFinalizer: its function runs on the finalizer goroutine, where a panic ends the process",
	},
}

// exemptMark on a line, or alone on the line above, leaves that line's
// goroutine start alone; the reason after it is required, for readers.
const exemptMark = "//golint:goroutine"

// CheckFile reports the go statements of f, its uses of the functions
// that start code on another goroutine (starters, called or not: a
// function value escapes the check just as well) through whatever name f
// imports their package by, and every method or function named Go
// (sync.WaitGroup.Go, errgroup.Group.Go) but safego's. A line marked
// with exemptMark and a reason is left alone; a mark without a reason
// is a problem. Parse f with its comments for the marks to count.
func CheckFile(fset *token.FileSet, f *ast.File) []Problem {
	pkgOf := map[string]string{} // local name -> import path, for starters and safego
	safegoName := ""
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		if _, ok := starters[p]; ok {
			pkgOf[name] = p
		}
		if strings.HasSuffix(p, "/internal/safego") {
			safegoName = name
		}
	}
	var probs []Problem
	exempt := map[int]bool{}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			rest, ok := strings.CutPrefix(c.Text, exemptMark)
			if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '\t') {
				continue
			}
			pos := fset.Position(c.Pos())
			if strings.TrimSpace(rest) == "" {
				probs = append(probs, Problem{pos, "golint:goroutine without a reason: say why the goroutine needs no safego"})
				continue
			}
			exempt[pos.Line], exempt[pos.Line+1] = true, true
		}
	}
	flag := func(n ast.Node, msg string) {
		pos := fset.Position(n.Pos())
		if !exempt[pos.Line] {
			probs = append(probs, Problem{pos, msg})
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			flag(n, "go statement: start goroutines with safego.Go (a panic there would end the nginx worker)")
		case *ast.SelectorExpr:
			id, isIdent := n.X.(*ast.Ident)
			if isIdent {
				if msg, ok := starters[pkgOf[id.Name]][n.Sel.Name]; ok {
					flag(n, msg)
					return true
				}
			}
			if n.Sel.Name == "Go" && (!isIdent || id.Name != safegoName) {
				flag(n, "Go method (sync.WaitGroup.Go, errgroup): start goroutines with safego.Go (a panic there would end the nginx worker)")
			}
		}
		return true
	})
	sort.SliceStable(probs, func(i, j int) bool { return probs[i].Pos.Line < probs[j].Pos.Line })
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
