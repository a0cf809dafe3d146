package nginx

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLibraryLiteralBackslash012: the http VM loads a file whose directory name
// holds the four characters `\012` (a backslash, not a newline: the kernel
// escapes only newlines in /proc/self/maps, so both look alike there). The
// stream VM, with no lib, loads the recorded file: of the two readings of
// `\012`, the one the linker finds loaded.
func TestLibraryLiteralBackslash012(t *testing.T) {
	requireStreamLua(t)
	p := libCopyIn(t, `qrpc\012lib`, "libffi_qrpc.so")
	c := streamConf(1)
	c.InitByLua = libConfigure(p, true)
	c.StreamInitByLua = libConfigure("", false)
	c.AllowErrors = []string{`.`}
	n := libStart(t, c)
	if got := libStreamAsk(t, n, "unary echo s"); got != "OK 0 s" {
		t.Errorf("stream VM (no lib; http loaded %q): %q", p, got)
	}
	libFilesMapped(t, n)
}

// TestLibraryRenamedThenNew: the http VM loads dir/libffi_qrpc.so; then a deploy
// keeps a backup by renaming it (mv libffi_qrpc.so libffi_qrpc.so.bak) and
// installs a new file under the old name. /proc/self/maps names the mapped
// file by its new name; the loader and the Go side find it by device and
// inode, so the stream VM loads the mapped file or is refused, never a
// second copy.
func TestLibraryRenamedThenNew(t *testing.T) {
	requireStreamLua(t)
	for _, tc := range []struct{ name, streamLib string }{
		{"stream no lib", ""},
		{"stream same path", "same"},
		{"stream another copy", "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := libCopyIn(t, "qrpc-lib-mv", "libffi_qrpc.so")
			c := streamConf(1)
			c.InitByLua = libConfigure(p, true)
			if tc.streamLib == "" {
				c.StreamInitByLua = libConfigure("", false)
			} else {
				lib := p
				if tc.streamLib == "other" {
					lib = libPath
				}
				c.StreamInitByLua = libConfigure(lib, false)
			}
			c.AllowErrors = []string{`.`}
			n := libStart(t, c)
			if err := os.Rename(p, p+".bak"); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(libPath)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o755); err != nil {
				t.Fatal(err)
			}
			got := libStreamAsk(t, n, "unary echo s")
			t.Logf("stream: %q", got)
			if got == "OK 0 s" && tc.streamLib == "other" {
				t.Errorf("stream VM loaded another copy while the worker runs the renamed %s", p)
			}
			libFilesMapped(t, n)
		})
	}
}

// TestLibraryShortNames: LuaJIT's other short forms of the file on the linker's
// path: a dot without the lib prefix, the prefix without a dot.
func TestLibraryShortNames(t *testing.T) {
	requireStreamLua(t)
	for _, tc := range []struct{ httpLib, streamLib string }{
		{"full", "ffi_qrpc.so"},
		{"full", "libffi_qrpc"},
		{"ffi_qrpc.so", "full"},
		{"libffi_qrpc", "ffi_qrpc"},
	} {
		t.Run(tc.httpLib+" "+tc.streamLib, func(t *testing.T) {
			p := libCopyIn(t, "qrpc-lib-short", "libffi_qrpc.so")
			h, s := tc.httpLib, tc.streamLib
			if h == "full" {
				h = p
			}
			if s == "full" {
				s = p
			}
			c := streamConf(1)
			c.ProcEnv = []string{"LD_LIBRARY_PATH=" + filepath.Dir(p)}
			c.InitByLua = libConfigure(h, true)
			c.StreamInitByLua = libConfigure(s, false)
			c.AllowErrors = []string{`.`}
			n := libStart(t, c)
			if got := libStreamAsk(t, n, "unary echo s"); got != "OK 0 s" {
				t.Errorf("stream VM: %q", got)
			}
			libFilesMapped(t, n)
		})
	}
}

// TestLibraryCarriageReturnName: the http VM loads a file whose name ends in
// "\r"; the stream VM is configured with another copy. The recorded entry
// keeps the "\r" (Go splits maps on newlines only), so the loader refuses
// the copy without loading it.
func TestLibraryCarriageReturnName(t *testing.T) {
	requireStreamLua(t)
	p := libCopyIn(t, "qrpc-lib-cr", "libffi_qrpc.so\r")
	c := streamConf(1)
	c.InitByLua = libConfigure(p, true)
	c.StreamInitByLua = libConfigure(libPath, false)
	c.AllowErrors = []string{`.`}
	n := libStart(t, c)
	want := fmt.Sprintf("ERR qrpc: cannot load %s: this worker runs another copy of the library (", libPath)
	if got := libStreamAsk(t, n, "unary echo s"); !strings.HasPrefix(got, want) {
		t.Errorf("stream VM: %q, want %q", got, want)
	}
	libFilesMapped(t, n)
}

// TestLibraryOtherRelease: the search finds first a libffi_qrpc.so of
// another release than the Lua modules (here a stand-in with qrpc_init
// and nothing else, built with the C compiler), beside the Lua root, and
// the current library next. Loading the first one starts its Go runtime
// in a real release, so the search stops there with a clear error rather
// than go on to load a second one; a file that is not the library at all
// (no qrpc_init) is passed over as before. The stand-in may as well be
// another library of that name that exports qrpc_init: the error says
// both.
func TestLibraryOtherRelease(t *testing.T) {
	requireNginx(t)
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	src := filepath.Join(t.TempDir(), "old.c")
	if err := os.WriteFile(src, []byte("int qrpc_init(char *e, unsigned long n) { (void)e; (void)n; return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := ngxConf{Workers: 1, AllowErrors: []string{`does not match these Lua modules`},
		InitByLua: libConfigure("", false),
		Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                ngx.say(tostring(select(2, qrpc.init_worker())))`)}
	n := startNginx(t, c)
	// the worker loads at the first request: the files go in place now
	old := filepath.Join(n.dir, "lua", "libffi_qrpc.so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", old, src).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	cur, err := os.ReadFile(libPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.dir, "libffi_qrpc.so"), cur, 0o755); err != nil {
		t.Fatal(err)
	}
	st, body := n.get("/t")
	want := "qrpc: cannot load " + old + ": a libffi_qrpc.so that does not match these Lua modules (it lacks qrpc_claim): another release, or another library of that name; install the library built with them\n"
	if st != 200 || body != want {
		t.Fatalf("%d %q, want %q", st, body, want)
	}
}
