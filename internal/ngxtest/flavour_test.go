package ngxtest

import (
	"os"
	"strings"
	"testing"
)

// TestFind probes the nginx QRPC_NGINX names (skipped where there is none)
// and checks that what was derived hangs together.
func TestFind(t *testing.T) {
	n, err := Find()
	if err != nil {
		if os.Getenv("CI") == "true" || os.Getenv(EnvNginx) != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	t.Log(n)
	if n.CorePath == "" || n.CorePath == "nil" || n.CoreVer == "" {
		t.Errorf("lua-resty-core not found by init_by_lua: %s", n)
	}
	switch n.Flavour {
	case Debian:
		if len(n.Modules) == 0 {
			t.Errorf("a Debian nginx without load_module lines: %s", n)
		}
	case OpenResty:
		if len(n.Modules) != 0 {
			t.Errorf("ngx_lua is built into OpenResty: %s", n)
		}
	case RestyFFI:
		if !n.LoadFFIFun || n.Host() != "resty_ffi" || !strings.Contains(n.MainConf(), "env LD_LIBRARY_PATH;") {
			t.Errorf("lua-resty-ffi flavour without its host: %s", n)
		}
	default:
		t.Errorf("flavour %q", n.Flavour)
	}
}

func TestFindRejectsUnknownNames(t *testing.T) {
	if _, err := find("openresty-please"); err == nil || !strings.Contains(err.Error(), "want debian, openresty, resty-ffi") {
		t.Errorf("err = %v", err)
	}
}

func TestEnvironDropsNGINXAndJoinsLibraryPath(t *testing.T) {
	n := &Nginx{RestyFFILib: "/opt/rf/lib"}
	env := n.Environ([]string{"PATH=/bin", "NGINX=/usr/sbin/nginx", "LD_LIBRARY_PATH=/a"}, "LD_LIBRARY_PATH=/b")
	want := "PATH=/bin LD_LIBRARY_PATH=/opt/rf/lib:/a:/b"
	if got := strings.Join(env, " "); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
