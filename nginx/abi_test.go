package nginx

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLuaCdefMatchesHeader compares the ffi.cdef of
// lua/resty/ffi/qrpc/cdef.lua with ffi/qrpc.h: the same structs field by
// field, the same prototypes, the same constant values. A drift there is silent memory corruption.
func TestLuaCdefMatchesHeader(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	hdrSrc, err := os.ReadFile(filepath.Join(root, "ffi", "qrpc.h"))
	if err != nil {
		t.Fatal(err)
	}
	luaSrc, err := os.ReadFile(filepath.Join(root, "lua", "resty", "ffi", "qrpc", "cdef.lua"))
	if err != nil {
		t.Fatal(err)
	}
	hdr := stripC(string(hdrSrc))
	cdef := luaCdef(t, string(luaSrc))

	hs, ls := cStructs(hdr), cStructs(cdef)
	if len(hs) == 0 {
		t.Fatal("no struct found in qrpc.h")
	}
	for name, fields := range hs {
		lf, ok := ls[name]
		if !ok {
			t.Errorf("cdef.lua does not declare %s", name)
			continue
		}
		if strings.Join(fields, "; ") != strings.Join(lf, "; ") {
			t.Errorf("%s differs:\nqrpc.h:   %s\ncdef.lua: %s", name, strings.Join(fields, "; "), strings.Join(lf, "; "))
		}
	}
	for name := range ls {
		if _, ok := hs[name]; !ok {
			t.Errorf("cdef.lua declares %s, which qrpc.h does not have", name)
		}
	}

	hf, lfn := cFuncs(hdr), cFuncs(cdef)
	for name, proto := range hf {
		if name == "libffi_init" {
			continue // lua-resty-ffi declares and calls it, not this module
		}
		if lp, ok := lfn[name]; !ok {
			t.Errorf("cdef.lua does not declare %s", name)
		} else if lp != proto {
			t.Errorf("%s differs:\nqrpc.h:   %s\ncdef.lua: %s", name, proto, lp)
		}
	}
	for name := range lfn {
		if _, ok := hf[name]; !ok {
			t.Errorf("cdef.lua declares %s, which qrpc.h does not have", name)
		}
	}

	// Constants: Lua's OP_X is QRPC_OP_X, QRPC_* keep their names,
	// CMD_VERSION is QRPC_CMD_VERSION.
	defs := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^#define\s+(QRPC_\w+)\s+(-?\d+)`).FindAllStringSubmatch(string(hdrSrc), -1) {
		defs[m[1]] = m[2]
	}
	n := 0
	for _, m := range regexp.MustCompile(`(?m)^local ((?:QRPC|OP|CMD)_\w+) = (-?\d+)`).FindAllStringSubmatch(string(luaSrc), -1) {
		name := m[1]
		if !strings.HasPrefix(name, "QRPC_") {
			name = "QRPC_" + name
		}
		v, ok := defs[name]
		switch {
		case !ok:
			t.Errorf("cdef.lua's %s = %s: no %s in qrpc.h", m[1], m[2], name)
		case v != m[2]:
			t.Errorf("cdef.lua's %s = %s, qrpc.h's %s = %s", m[1], m[2], name, v)
		}
		n++
	}
	if n < 10 {
		t.Errorf("only %d constants found in cdef.lua", n)
	}
}

func stripC(s string) string {
	s = regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`//[^\n]*`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`(?m)^\s*#[^\n]*`).ReplaceAllString(s, " ")
	return s
}

// luaCdef returns the cdef block that declares the library's ABI.
func luaCdef(t *testing.T, src string) string {
	t.Helper()
	i := strings.Index(src, "ffi.cdef[[\ntypedef struct")
	if i < 0 {
		t.Fatal("cdef.lua: no ffi.cdef[[ typedef struct ... block")
	}
	rest := src[i+len("ffi.cdef[["):]
	j := strings.Index(rest, "]]")
	if j < 0 {
		t.Fatal("cdef.lua: unterminated cdef")
	}
	return stripC(rest[:j])
}

var (
	spaces   = regexp.MustCompile(`\s+`)
	starSp   = regexp.MustCompile(`\s*\*\s*`)
	structRe = regexp.MustCompile(`typedef\s+struct\s*\{([^}]*)\}\s*(\w+)\s*;`)
	funcRe   = regexp.MustCompile(`([A-Za-z_][\w\s\*]*?)\b((?:qrpc|libffi)_\w+)\s*\(([^)]*)\)\s*;`)
)

func normDecl(s string) string {
	s = spaces.ReplaceAllString(strings.TrimSpace(s), " ")
	return starSp.ReplaceAllString(s, " *")
}

func cStructs(src string) map[string][]string {
	out := map[string][]string{}
	for _, m := range structRe.FindAllStringSubmatch(src, -1) {
		var fields []string
		for _, f := range strings.Split(m[1], ";") {
			if f = normDecl(f); f != "" {
				fields = append(fields, f)
			}
		}
		out[m[2]] = fields
	}
	return out
}

func cFuncs(src string) map[string]string {
	src = structRe.ReplaceAllString(src, " ")
	out := map[string]string{}
	for _, m := range funcRe.FindAllStringSubmatch(src, -1) {
		var params []string
		for _, p := range strings.Split(m[3], ",") {
			params = append(params, normDecl(p))
		}
		out[m[2]] = normDecl(m[1]) + " " + m[2] + "(" + strings.Join(params, ", ") + ")"
	}
	return out
}
