package golint

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckFile(t *testing.T) {
	src := `package p

import (
	tm "time"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

func f() {
	go work()
	go func() {}()
	tm.AfterFunc(0, work)
	later := tm.AfterFunc
	_ = later
	safego.Go("kind", work, nil)
	safego.AfterFunc("kind", 0, work, nil)
	var time struct{ AfterFunc func() }
	time.AfterFunc = work
}

func work() {}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range CheckFile(fset, f) {
		got = append(got, p.String())
	}
	want := []string{
		"p.go:9: go statement",
		"p.go:10: go statement",
		"p.go:11: time.AfterFunc",
		"p.go:12: time.AfterFunc",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d: %q, want it to start with %q", i, got[i], want[i])
		}
	}
}

// TestCheckFileSeesEveryGoroutineStart: beside go statements and
// time.AfterFunc, every standard way to have code run on another
// goroutine is flagged (sync.WaitGroup.Go, errgroup's Go, context.AfterFunc,
// runtime.AddCleanup, runtime.SetFinalizer), through whatever name f
// imports its package by; safego's own Go is not, nor a use the line
// exempts with a reason, while an exemption without one is a problem.
func TestCheckFileSeesEveryGoroutineStart(t *testing.T) {
	src := `package p

import (
	"context"
	rt "runtime"
	"sync"
	sg "github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

func f(ctx context.Context, x *int) {
	var wg sync.WaitGroup
	wg.Go(work)
	context.AfterFunc(ctx, work)
	rt.AddCleanup(x, func(int) {}, 0)
	rt.SetFinalizer(x, nil)
	sg.Go("kind", work, nil)
	rt.SetFinalizer(x, nil) //golint:goroutine clears a finalizer: starts nothing
	//golint:goroutine
	rt.SetFinalizer(x, nil)
	rt.GC()
}

func work() {}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range CheckFile(fset, f) {
		got = append(got, p.String())
	}
	want := []string{
		"p.go:12: Go method",
		"p.go:13: context.AfterFunc",
		"p.go:14: runtime.AddCleanup",
		"p.go:15: runtime.SetFinalizer",
		"p.go:18: golint:goroutine without a reason",
		"p.go:19: runtime.SetFinalizer",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d: %q, want it to start with %q", i, got[i], want[i])
		}
	}
}

// TestLibraryDirs: the library's packages are found from the module's
// root, the exempt ones left out.
func TestLibraryDirs(t *testing.T) {
	dirs, err := LibraryDirs("../..")
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(dirs, "\n")
	for _, want := range []string{"/qrpc", "/internal/bridge", "/internal/hostq", "/ffi"} {
		if !strings.Contains(joined, want+"\n") && !strings.HasSuffix(joined, want) {
			t.Errorf("%s missing from %s", want, joined)
		}
	}
	if strings.Contains(joined, "/internal/safego") {
		t.Errorf("internal/safego checked: %s", joined)
	}
}

// TestKindsDocumented: every kind of goroutine the library names to
// safego (a value of qrpc_client_panics_total's where label) is listed
// in docs/metrics.md.
func TestKindsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := LibraryDirs("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	fset := token.NewFileSet()
	for _, dir := range dirs {
		names, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range Kinds(f) {
				if !seen[k] && !strings.Contains(string(doc), "`"+k+"`") {
					t.Errorf("%s: kind %q is not in docs/metrics.md (qrpc_client_panics_total)", name, k)
				}
				seen[k] = true
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("only %d kinds found: %v", len(seen), seen)
	}
}
