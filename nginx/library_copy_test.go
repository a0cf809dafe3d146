package nginx

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLibraryCopy: the http VM loads the library, then the stream VM is
// configured with another path (two lua_package_path trees, each with the
// library beside it, or a configure{ lib } of its own). A copy of the
// file, under its name or another, would start a second Go runtime in
// the worker: the stream VM gets a clear error instead. A hard link of
// the same file is the same library (the dynamic linker matches device
// and inode) and loads. Either way the worker maps one file.
func TestLibraryCopy(t *testing.T) {
	requireStreamLua(t)
	b, err := os.ReadFile(libPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file string
		link       bool // a hard link of libPath instead of a copy
		want       string
	}{
		{"a copy", "libffi_qrpc.so", false, "ERR qrpc: cannot load %s: this worker runs another copy of the library ("},
		{"a copy under another name", "libffi_qrpc-2.so", false, "ERR qrpc: cannot load %s: this worker runs another copy of the library ("},
		{"a hard link", "libffi_qrpc.so", true, "OK 0 s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// beside libPath for the link (one file system); readable by
			// the workers' user
			dir, err := os.MkdirTemp(filepath.Dir(libPath), "qrpc-copy-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			_ = os.Chmod(dir, 0o755)
			cp := filepath.Join(dir, tc.file)
			if tc.link {
				err = os.Link(libPath, cp)
			} else {
				err = os.WriteFile(cp, b, 0o755)
			}
			if err != nil {
				t.Fatal(err)
			}
			c := streamConf(1)
			c.StreamInitByLua = libConfigure(cp, false)
			c.AllowErrors = []string{`another copy of the library`}
			n := libStart(t, c)
			l, err := dialLines(n.streamPort, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer l.close()
			want := tc.want
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, cp)
			}
			if got, err := l.ask("unary echo s", 20*time.Second); err != nil || !strings.HasPrefix(got, want) {
				t.Fatalf("stream VM: %q %v, want %q", got, err, want)
			}
			libFilesMapped(t, n)
			if got := httpAsk(t, n, "unary echo h2"); got != "OK 0 h2" {
				t.Errorf("http after: %q", got)
			}
		})
	}
}

// TestLibraryCopyLinkerName: the http VM loads libPath; the stream VM is
// configured with a bare name, lib = "libffi_qrpc.so", which the dynamic
// linker finds through LD_LIBRARY_PATH: a copy of the file. The loader
// refuses it without loading it (loading would start a second Go
// runtime), and the worker maps one file of the library.
func TestLibraryCopyLinkerName(t *testing.T) {
	requireStreamLua(t)
	b, err := os.ReadFile(libPath)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(filepath.Dir(libPath), "qrpc-ldpath-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "libffi_qrpc.so"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	c := streamConf(1)
	c.ProcEnv = []string{"LD_LIBRARY_PATH=" + dir}
	c.StreamInitByLua = libConfigure("libffi_qrpc.so", false)
	c.AllowErrors = []string{`another copy of the library`}
	n := libStart(t, c)
	l, err := dialLines(n.streamPort, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	got, err := l.ask("unary echo s", 20*time.Second)
	t.Logf("stream VM: %q %v", got, err)
	if !strings.HasPrefix(got, "ERR qrpc: cannot load libffi_qrpc.so: this worker runs another copy of the library (") {
		t.Errorf("stream VM: %q, want the loader's refusal", got)
	}
	libFilesMapped(t, n)
	if got := httpAsk(t, n, "unary echo h2"); got != "OK 0 h2" {
		t.Errorf("http after: %q", got)
	}
}
