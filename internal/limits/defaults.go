package limits

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
)

// Defaults are the values Go's qrpc.Config takes for an option left out
// (or 0), which Lua needs too: the connection cache compares options with
// their defaults filled in, so that connect({ streams = 32 }) and
// connect({}) share a connection. limits.lua gets them from here (make
// limits); make lint fails when one differs from what qrpc/config.go's
// populate() sets (GoDefaults reads it), so neither side can drift.
var Defaults = []struct {
	Name  string // in limits.lua
	Field string // the qrpc.Config field populate() fills
	Unit  int64  // Lua's unit of the field: 1, or nanoseconds per ms
	Value int64  // in Lua's unit
}{
	{"DEFAULT_CONNS", "Conns", 1, 1},
	{"DEFAULT_STREAMS", "Streams", 1, 32},
	{"DEFAULT_STREAM_BATCH", "StreamBatch", 1, 16},
	{"DEFAULT_TIMEOUT_MS", "DialTimeout", 1e6, 5000},
	{"DEFAULT_IDLE_TIMEOUT_MS", "IdleTimeout", 1e6, 30000},
	{"DEFAULT_MAX_FRAME_SIZE", "MaxFrameSize", 1, 16 << 20},
}

// GoDefaults reads qrpc/config.go's populate(): for each
// `if cfg.F == 0 { cfg.F = <expr> }`, F and the value of expr (integer
// literals, * and <<, time.Second and friends, and constants of package
// qrpc and of qrpc/internal/frame). root is the repository.
func GoDefaults(root string) (map[string]int64, error) {
	fset := token.NewFileSet()
	consts := map[string]ast.Expr{}
	var populate *ast.FuncDecl
	for _, dir := range []string{"qrpc", filepath.Join("qrpc", "internal", "frame")} {
		pkgs, err := parser.ParseDir(fset, filepath.Join(root, dir), func(fi fs.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, 0)
		if err != nil {
			return nil, err
		}
		for _, p := range pkgs {
			for _, f := range p.Files {
				for _, d := range f.Decls {
					switch d := d.(type) {
					case *ast.GenDecl:
						if d.Tok != token.CONST {
							continue
						}
						for _, s := range d.Specs {
							vs := s.(*ast.ValueSpec)
							for i, n := range vs.Names {
								if i < len(vs.Values) {
									consts[p.Name+"."+n.Name] = vs.Values[i]
								}
							}
						}
					case *ast.FuncDecl:
						if d.Name.Name == "populate" && d.Recv != nil && p.Name == "qrpc" {
							if se, ok := d.Recv.List[0].Type.(*ast.StarExpr); ok {
								if id, ok := se.X.(*ast.Ident); ok && id.Name == "Config" {
									populate = d
								}
							}
						}
					}
				}
			}
		}
	}
	if populate == nil {
		return nil, fmt.Errorf("qrpc/config.go: no func (c *Config) populate()")
	}
	var eval func(pkg string, e ast.Expr) (int64, error)
	eval = func(pkg string, e ast.Expr) (int64, error) {
		switch e := e.(type) {
		case *ast.BasicLit:
			return strconv.ParseInt(e.Value, 0, 64)
		case *ast.ParenExpr:
			return eval(pkg, e.X)
		case *ast.BinaryExpr:
			a, err := eval(pkg, e.X)
			if err != nil {
				return 0, err
			}
			b, err := eval(pkg, e.Y)
			if err != nil {
				return 0, err
			}
			switch e.Op {
			case token.MUL:
				return a * b, nil
			case token.SHL:
				return a << b, nil
			case token.ADD:
				return a + b, nil
			}
		case *ast.Ident:
			if c, ok := consts[pkg+"."+e.Name]; ok {
				return eval(pkg, c)
			}
		case *ast.SelectorExpr:
			x, _ := e.X.(*ast.Ident)
			if x != nil && x.Name == "time" {
				switch e.Sel.Name {
				case "Millisecond":
					return 1e6, nil
				case "Second":
					return 1e9, nil
				}
			}
			if x != nil {
				if c, ok := consts[x.Name+"."+e.Sel.Name]; ok {
					return eval(x.Name, c)
				}
			}
		}
		return 0, fmt.Errorf("cannot evaluate %T at %s", e, fset.Position(e.Pos()))
	}
	out := map[string]int64{}
	for _, st := range populate.Body.List {
		is, ok := st.(*ast.IfStmt)
		if !ok || len(is.Body.List) != 1 {
			continue
		}
		as, ok := is.Body.List[0].(*ast.AssignStmt)
		if !ok || len(as.Lhs) != 1 || len(as.Rhs) != 1 {
			continue
		}
		sel, ok := as.Lhs[0].(*ast.SelectorExpr)
		if !ok {
			continue
		}
		v, err := eval("qrpc", as.Rhs[0])
		if err != nil {
			continue // a default Lua does not need (a computed one)
		}
		out[sel.Sel.Name] = v
	}
	return out, nil
}

// CheckDefaults returns an error naming each default of Defaults that
// differs from Go's.
func CheckDefaults(root string) error {
	got, err := GoDefaults(root)
	if err != nil {
		return err
	}
	var bad []string
	for _, d := range Defaults {
		v, ok := got[d.Field]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: qrpc.Config.%s has no default in populate()", d.Name, d.Field))
			continue
		}
		if v != d.Value*d.Unit {
			bad = append(bad, fmt.Sprintf("%s is %d here, Go's qrpc.Config.%s default is %d", d.Name, d.Value, d.Field, v/d.Unit))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return nil
}
