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

// TestDefaultsAreGos: the defaults limits.lua carries are those
// qrpc.Config's populate() sets.
func TestDefaultsAreGos(t *testing.T) {
	got, err := GoDefaults("../..")
	if err != nil {
		t.Fatal(err)
	}
	if got["Streams"] != 32 || got["DialTimeout"] != 5e9 {
		t.Fatalf("populate() read as %v", got)
	}
	if err := CheckDefaults("../.."); err != nil {
		t.Fatal(err)
	}
}
