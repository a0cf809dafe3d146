package nginx

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLuaCdefMatchesHeader compares the ffi.cdef of
// lua/resty/ffi/qrpc/abi.lua with ffi/qrpc.h: the same structs field by
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
	luaSrc, err := os.ReadFile(filepath.Join(root, "lua", "resty", "ffi", "qrpc", "abi.lua"))
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
			t.Errorf("abi.lua does not declare %s", name)
			continue
		}
		if strings.Join(fields, "; ") != strings.Join(lf, "; ") {
			t.Errorf("%s differs:\nqrpc.h:   %s\nabi.lua:  %s", name, strings.Join(fields, "; "), strings.Join(lf, "; "))
		}
	}
	for name := range ls {
		if _, ok := hs[name]; !ok {
			t.Errorf("abi.lua declares %s, which qrpc.h does not have", name)
		}
	}

	hf, lfn := cFuncs(hdr), cFuncs(cdef)
	for name, proto := range hf {
		if name == "libffi_init" {
			continue // lua-resty-ffi declares and calls it, not this module
		}
		if lp, ok := lfn[name]; !ok {
			t.Errorf("abi.lua does not declare %s", name)
		} else if lp != proto {
			t.Errorf("%s differs:\nqrpc.h:   %s\nabi.lua:  %s", name, proto, lp)
		}
	}
	for name := range lfn {
		if _, ok := hf[name]; !ok {
			t.Errorf("abi.lua declares %s, which qrpc.h does not have", name)
		}
	}

	checkConstants(t, root, string(hdrSrc), string(luaSrc))
}

// checkConstants compares every numeric #define of qrpc.h with abi.lua's
// constants, both ways (Lua's OP_X is QRPC_OP_X, F_X is QRPC_F_X,
// CMD_VERSION is QRPC_CMD_VERSION, QRPC_* keep their names); checks that
// every error status has its words in status_names, keyed by name; and
// that no other Lua file defines an ABI constant of its own.
func checkConstants(t *testing.T, root, hdrSrc, luaSrc string) {
	t.Helper()
	defs := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^#define\s+(QRPC_\w+)\s+(-?\d+)`).FindAllStringSubmatch(hdrSrc, -1) {
		defs[m[1]] = m[2]
	}
	if len(defs) < 20 {
		t.Fatalf("only %d numeric #defines found in qrpc.h", len(defs))
	}
	abiName := regexp.MustCompile(`^(?:QRPC|OP|F|CMD)_\w+$`)
	cName := func(lua string) string {
		if strings.HasPrefix(lua, "QRPC_") {
			return lua
		}
		return "QRPC_" + lua
	}
	lua := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^local (\w+) = (-?\d+)\s*$`).FindAllStringSubmatch(luaSrc, -1) {
		if abiName.MatchString(m[1]) {
			lua[cName(m[1])] = m[2]
		}
	}
	for name, v := range defs {
		lv, ok := lua[name]
		switch {
		case !ok:
			t.Errorf("qrpc.h's %s = %s: abi.lua does not define it", name, v)
		case lv != v:
			t.Errorf("qrpc.h's %s = %s, abi.lua's = %s", name, v, lv)
		}
	}
	for name, v := range lua {
		if _, ok := defs[name]; !ok {
			t.Errorf("abi.lua's %s = %s: no such #define in qrpc.h", name, v)
		}
	}

	// status_names: keyed by the constants' names, one entry per error.
	i := strings.Index(luaSrc, "local status_names = {")
	if i < 0 {
		t.Fatal("abi.lua: no status_names table")
	}
	body := luaSrc[i:]
	body = body[:strings.Index(body, "\n}")]
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`\[(\S+)\]\s*=`).FindAllStringSubmatch(body, -1) {
		if !strings.HasPrefix(m[1], "QRPC_ERR") {
			t.Errorf("status_names key %s: use the constant's name", m[1])
		}
		named[m[1]] = true
	}
	for name := range defs {
		if strings.HasPrefix(name, "QRPC_ERR") && !named[name] {
			t.Errorf("status_names has no words for %s", name)
		}
	}

	// The other Lua files take the constants from abi.lua.
	files, err := filepath.Glob(filepath.Join(root, "lua", "resty", "ffi", "*.lua"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(filepath.Join(root, "lua", "resty", "ffi", "qrpc", "*.lua"))
	files = append(files, more...)
	own := regexp.MustCompile(`(?m)^local ((?:QRPC|OP|F|CMD)_\w+) = -?\d+`)
	for _, f := range files {
		if filepath.Base(f) == "abi.lua" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range own.FindAllStringSubmatch(string(b), -1) {
			t.Errorf("%s defines %s itself: take it from abi.lua", filepath.Base(f), m[1])
		}
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
		t.Fatal("abi.lua: no ffi.cdef[[ typedef struct ... block")
	}
	rest := src[i+len("ffi.cdef[["):]
	j := strings.Index(rest, "]]")
	if j < 0 {
		t.Fatal("abi.lua: unterminated cdef")
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

// The bounds of retries and hedge.max are checked in Lua (so that a caller
// gets "bad argument") and again in Go (defence): both must be the same
// numbers, or values between them would reach a caller as "bad command".
func TestRetriesBoundMatchesGo(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	read := func(rel string, re *regexp.Regexp) string {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no match for %s", rel, re)
		}
		return string(m[1])
	}
	for _, b := range []struct{ goName, luaName string }{
		{"MaxRetries", "MAX_RETRIES"},
		{"MaxHedge", "MAX_HEDGE"},
	} {
		goMax := read("qrpc/pool.go", regexp.MustCompile(`(?m)^const `+b.goName+` = (\d+)`))
		luaMax := read("lua/resty/ffi/qrpc/pool.lua", regexp.MustCompile(`(?m)^local `+b.luaName+` = (\d+)`))
		if goMax != luaMax {
			t.Errorf("%s: Go refuses above %s, Lua above %s", b.goName, goMax, luaMax)
		}
	}
}
