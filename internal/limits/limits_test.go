package limits

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestLuaCopyUpToDate: the committed limits.lua is what make limits
// writes from this package.
func TestLuaCopyUpToDate(t *testing.T) {
	got, err := os.ReadFile(filepath.Join("..", "..", LuaPath))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, LuaSource()) {
		t.Fatalf("%s differs from internal/limits: run make limits and commit it", LuaPath)
	}
}
