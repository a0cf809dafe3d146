package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

// The benchmark runs only when someone runs it: a change to the module
// that one of its Lua files or its nginx config still relies on (a
// function moved to another module) broke `make bench-update` unseen.
// A short run of the sections that need no tool beyond wrk (no perf,
// no other nginx flavour) must end well and report each of them.
func TestBenchQuickSmoke(t *testing.T) {
	ngxtest.Long(t, "a quick run of several bench sections")
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Skip("no nginx on PATH")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	figures := "ipc,unary,memory,metrics,pools"
	sections := []string{"**IPC alone", "**Unary over QUIC", "**Memory", "**Metrics recording", "**Pools:"}
	if _, err := exec.LookPath("wrk"); err == nil {
		figures += ",proto"
		sections = append(sections, "**Protobuf: demo.Profile")
	} else {
		t.Log("no wrk on PATH (.ci/run installs it): the protobuf section is left out")
	}
	out := filepath.Join(t.TempDir(), "r.md")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./bench", "-quick", "-only", figures, "-out", out)
	cmd.Dir = root
	cmd.Env = withoutEnv(os.Environ(), "GOMAXPROCS")
	log, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./bench: %v\n%s", err, log)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range sections {
		if !strings.Contains(string(md), sec) {
			t.Errorf("the report has no section %q:\n%s", sec, md)
		}
	}
}
