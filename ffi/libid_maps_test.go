package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestLibIDRawPath(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"7f0000000000-7f0000001000 r-xp 00000000 fe:00 123                        /a  b/lib.so", "/a  b/lib.so"},
		{"7f0000000000-7f0000001000 r-xp 00000000 fe:00 123 /a/lib.so (deleted)", "/a/lib.so (deleted)"},
		{"7f0000000000-7f0000001000 r-xp 00000000 fe:00 123                        /a\tb/ lib.so ", "/a\tb/ lib.so "},
		{"7f0000000000-7f0000001000 r-xp 00000000 fe:00 123                        /a\\012b/lib.so", "/a\\012b/lib.so"},
	} {
		if got := rawPath(tc.line); got != tc.want {
			t.Errorf("rawPath(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestLibIDMapsCarriageReturn: a mapped file whose name ends in "\r": the
// kernel writes it as is, and eachMapping's entry keeps it, as the Lua
// loader's f:lines() does, so both read one QRPC_LIBRARY.
func TestLibIDMapsCarriageReturn(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lib.so\r")
	if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	found := ""
	eachMapping(func(_, _ uint64, e string) bool {
		if strings.Contains(e, filepath.Dir(p)) {
			found = e
			return false
		}
		return true
	})
	if !strings.HasSuffix(found, p) {
		t.Errorf("entry %q does not end with the path %q", found, p)
	}
}
