package nginx

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestLuaCdefMatchesHeader compares the ffi.cdef of
// lua/resty/ffi/qrpc/abi.lua with internal/hostq/qrpc.h: the same structs field by
// field, the same prototypes, and every constant (each #define and enum
// of qrpc.h against each numeric constant of abi.lua, both ways). A drift
// there is silent memory corruption.
func TestLuaCdefMatchesHeader(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	hdrSrc, err := os.ReadFile(filepath.Join(root, "internal", "hostq", "qrpc.h"))
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

// cConstants returns every constant qrpc.h defines, by name: each
// #define with a value (the include guard has none) and each enumerator.
// A value that is not an integer literal fails the test: nothing could
// compare it.
func cConstants(t *testing.T, hdrSrc string) map[string]int64 {
	t.Helper()
	// Comments out first: a comment may span lines and hold "#define".
	src := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(hdrSrc, " ")
	src = regexp.MustCompile(`//[^\n]*`).ReplaceAllString(src, " ")
	out := map[string]int64{}
	add := func(name, val string) {
		v, err := strconv.ParseInt(strings.Trim(strings.TrimSpace(val), "()"), 0, 64)
		if err != nil {
			t.Errorf("qrpc.h: %s = %q is not an integer constant", name, val)
			return
		}
		if _, dup := out[name]; dup {
			t.Errorf("qrpc.h defines %s twice", name)
		}
		out[name] = v
	}
	for _, m := range regexp.MustCompile(`(?m)^[ \t]*#[ \t]*define[ \t]+(\w+)([ \t]+[^\n]*)?$`).FindAllStringSubmatch(src, -1) {
		if strings.TrimSpace(m[2]) == "" {
			continue // the include guard
		}
		add(m[1], m[2])
	}
	for _, m := range regexp.MustCompile(`(?s)\benum\b[^{;]*\{([^}]*)\}`).FindAllStringSubmatch(src, -1) {
		next := int64(0)
		for _, e := range strings.Split(m[1], ",") {
			e = strings.TrimSpace(e)
			if e == "" {
				continue
			}
			name, val, hasVal := strings.Cut(e, "=")
			name = strings.TrimSpace(name)
			if hasVal {
				add(name, val)
			} else {
				out[name] = next
			}
			next = out[name] + 1
		}
	}
	return out
}

// luaConstants returns every numeric constant abi.lua defines (a "local
// NAME = <integer>" with an upper-case name), under its qrpc.h name
// (OP_X is QRPC_OP_X, F_X is QRPC_F_X, CMD_VERSION is QRPC_CMD_VERSION,
// QRPC_* keep theirs), and the names the module table exports. Only the
// ABI's names may be numeric constants there: anything else upper-case
// with a number would be a constant that qrpc.h does not know.
func luaConstants(t *testing.T, luaSrc string) (consts map[string]int64, exported map[string]bool) {
	t.Helper()
	abiName := regexp.MustCompile(`^(?:QRPC|OP|F|CMD)_\w+$`)
	consts = map[string]int64{}
	for _, m := range regexp.MustCompile(`(?m)^local ([A-Z][A-Z0-9_]*) = (-?(?:0x[0-9a-fA-F]+|\d+))\s*(?:--[^\n]*)?$`).FindAllStringSubmatch(luaSrc, -1) {
		if !abiName.MatchString(m[1]) {
			continue // ERRBUF_LEN, HBUF_SMALL...: the module's own sizes
		}
		v, err := strconv.ParseInt(m[2], 0, 64)
		if err != nil {
			t.Errorf("abi.lua: %s = %s: %v", m[1], m[2], err)
			continue
		}
		name := m[1]
		if !strings.HasPrefix(name, "QRPC_") {
			name = "QRPC_" + name
		}
		if _, dup := consts[name]; dup {
			t.Errorf("abi.lua defines %s twice", m[1])
		}
		consts[name] = v
	}
	// The module table: "NAME = NAME," for each constant, no literal.
	i := strings.Index(luaSrc, "\nlocal _M = {")
	if i < 0 {
		t.Fatal("abi.lua: no module table")
	}
	tbl := luaSrc[i:]
	tbl = tbl[:strings.Index(tbl, "\n}")]
	exported = map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*([A-Z][A-Z0-9_]*)\s*=\s*([^,\n]+),`).FindAllStringSubmatch(tbl, -1) {
		if !abiName.MatchString(m[1]) {
			continue
		}
		_, isConst := consts[m[1]]
		if !isConst {
			_, isConst = consts["QRPC_"+m[1]]
		}
		literal := regexp.MustCompile(`^-?\d`).MatchString(m[2])
		if literal || (isConst && m[2] != m[1]) {
			t.Errorf("abi.lua's module table sets %s = %s: export the local of that name", m[1], m[2])
		}
		exported[m[1]] = true
	}
	return consts, exported
}

// checkConstants compares every constant of qrpc.h (cConstants) with
// abi.lua's (luaConstants), both ways; checks that abi.lua exports each
// one, that every error status has its words in status_names, keyed by
// name; and that the other Lua files define no ABI constant of their own
// and read only names abi.lua exports.
func checkConstants(t *testing.T, root, hdrSrc, luaSrc string) {
	t.Helper()
	defs := cConstants(t, hdrSrc)
	if len(defs) < 30 {
		t.Fatalf("only %d constants found in qrpc.h", len(defs))
	}
	lua, exported := luaConstants(t, luaSrc)
	luaName := func(c string) string {
		if n := strings.TrimPrefix(c, "QRPC_"); strings.HasPrefix(n, "OP_") || strings.HasPrefix(n, "F_") || strings.HasPrefix(n, "CMD_") {
			return n
		}
		return c
	}
	for name, v := range defs {
		lv, ok := lua[name]
		switch {
		case !ok:
			t.Errorf("qrpc.h's %s = %d: abi.lua does not define %s", name, v, luaName(name))
		case lv != v:
			t.Errorf("qrpc.h's %s = %d, abi.lua's %s = %d", name, v, luaName(name), lv)
		}
		if ok && !exported[luaName(name)] {
			t.Errorf("abi.lua does not export %s in its module table", luaName(name))
		}
	}
	for name, v := range lua {
		if _, ok := defs[name]; !ok {
			t.Errorf("abi.lua's %s = %d: no such constant in qrpc.h", luaName(name), v)
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
		} else if _, ok := defs[m[1]]; !ok {
			t.Errorf("status_names key %s: no such constant in qrpc.h", m[1])
		}
		named[m[1]] = true
	}
	for name := range defs {
		if strings.HasPrefix(name, "QRPC_ERR") && !named[name] {
			t.Errorf("status_names has no words for %s", name)
		}
	}

	// The other Lua files take the constants from abi.lua: none defines
	// one (as a local or a table field) with a number, and every abi.X
	// they read is exported.
	files, err := filepath.Glob(filepath.Join(root, "lua", "resty", "ffi", "*.lua"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(filepath.Join(root, "lua", "resty", "ffi", "qrpc", "*.lua"))
	deeper, _ := filepath.Glob(filepath.Join(root, "lua", "resty", "ffi", "qrpc", "*", "*.lua"))
	files = append(append(files, more...), deeper...)
	own := regexp.MustCompile(`(?m)^\s*(?:local\s+)?((?:QRPC|OP|F|CMD)_\w+)\s*=\s*-?\d+`)
	reads := regexp.MustCompile(`\babi\.((?:QRPC|OP|F|CMD)_\w+)`)
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
		for _, m := range reads.FindAllStringSubmatch(string(b), -1) {
			if !exported[m[1]] {
				t.Errorf("%s reads abi.%s, which abi.lua does not export", filepath.Base(f), m[1])
			}
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
