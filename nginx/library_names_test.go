package nginx

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLibraryRenamedToDeletedName: the http VM loads dir/libffi_qrpc.so; a
// backup is made with mv under a name that ends in " (deleted)". The file
// is not replaced: it is still the mapped file, under its new name. The
// stream VM (no lib, or lib = that new name) loads it: the suffix is the
// kernel's mark only when no file of that name is the loaded one.
func TestLibraryRenamedToDeletedName(t *testing.T) {
	requireStreamLua(t)
	for _, tc := range []string{"no lib", "new name"} {
		t.Run(tc, func(t *testing.T) {
			p := libCopyIn(t, "qrpc-lib-lib6del", "libffi_qrpc.so")
			c := streamConf(1)
			c.InitByLua = libConfigure(p, true)
			if tc == "no lib" {
				c.StreamInitByLua = libConfigure("", false)
			} else {
				c.StreamInitByLua = libConfigure(p+" (deleted)", false)
			}
			c.AllowErrors = []string{`.`}
			n := libStart(t, c)
			if err := os.Rename(p, p+" (deleted)"); err != nil {
				t.Fatal(err)
			}
			if got := libStreamAsk(t, n, "unary echo s"); got != "OK 0 s" {
				t.Errorf("stream VM (the loaded file only renamed to %q): %q", p+" (deleted)", got)
			}
			libFilesMapped(t, n)
		})
	}
}

// TestLibraryNewlineAndLiteral012: the http VM loads a file in a directory whose
// name holds a real newline; another copy of the library sits in a
// directory whose name holds the four characters `\012` (both names look
// alike in /proc/self/maps). The stream VM (no lib) loads the file the
// worker runs, the reading the linker finds loaded, not the other copy.
func TestLibraryNewlineAndLiteral012(t *testing.T) {
	requireStreamLua(t)
	p := libCopyIn(t, "qrpc\nlib6", "libffi_qrpc.so")
	lit := libCopyIn(t, `qrpc\012lib6`, "libffi_qrpc.so")
	c := streamConf(1)
	c.InitByLua = libConfigure(p, true)
	c.StreamInitByLua = libConfigure("", false)
	c.AllowErrors = []string{`.`}
	n := libStart(t, c)
	if got := libStreamAsk(t, n, "unary echo s"); got != "OK 0 s" {
		t.Errorf("stream VM (no lib; http loaded %q, a copy at %q): %q", p, lit, got)
	}
	libFilesMapped(t, n)
	_ = filepath.Join
}
