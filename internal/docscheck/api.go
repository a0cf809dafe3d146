package docscheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Where the names come from: the argument checks of the Lua module. Each
// source names a table (or a pattern) that the code itself uses to accept
// or refuse an option, so a new option cannot be accepted without being
// read here.
type nameSource struct {
	file  string // relative to the repository
	table string // a "local NAME = {" table, or "_M.keys" for pool.lua's
	what  string
}

var optionSources = []nameSource{
	// every option, as data (generated from internal/schema)
	{"lua/resty/ffi/qrpc/schema.lua", "@schema", "option"},
	{"lua/resty/ffi/qrpc/pool.lua", "keys", "pool option"},
}

// The nested pool options, read where pool.lua checks them.
var nestedOptionRe = regexp.MustCompile(`\b(health|check)\.([a-z_]+)\b`)

var (
	luaCommentRe = regexp.MustCompile(`--[^\n]*`)
	tableKeyRe   = regexp.MustCompile(`\b([a-z_][a-z0-9_]*)\s*=`)
	publicFuncRe = regexp.MustCompile(`(?m)^function _M\.([a-z][a-z0-9_]*)\s*\(`)
	schemaNameRe = regexp.MustCompile(`(?m)^\s*\{ name = "([a-z_.]+)"`)
	// the connection object's methods, in qrpc.lua
	connMethodRe = regexp.MustCompile(`(?m)^function methods\.([a-z][a-z0-9_]*)\s*\(`)
)

// tableKeys returns the keys of the Lua table `NAME = { ... }` in src.
func tableKeys(src, name string) ([]string, error) {
	re := regexp.MustCompile(`(?m)(?:^local |^\s+)` + regexp.QuoteMeta(name) + `\s*=\s*\{`)
	loc := re.FindStringIndex(src)
	if loc == nil {
		return nil, fmt.Errorf("no table %q", name)
	}
	rest := luaCommentRe.ReplaceAllString(src[loc[1]:], "")
	depth := 1
	end := -1
	for i, c := range rest {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		}
		if depth == 0 {
			end = i
			break
		}
	}
	if end < 0 {
		return nil, fmt.Errorf("table %q does not end", name)
	}
	var keys []string
	for _, m := range tableKeyRe.FindAllStringSubmatch(rest[:end], -1) {
		keys = append(keys, m[1])
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("table %q has no keys", name)
	}
	return keys, nil
}

// Names are the documented surface the code defines.
type Names struct {
	Functions []string // qrpc.X and conn methods
	Proto     []string // qrpc.proto.X (the facade table in qrpc.lua)
	Options   []string // connect, call, configure and pool options
}

// ReadNames reads the public functions and the accepted options from the
// Lua sources under root.
func ReadNames(root string) (Names, error) {
	var n Names
	read := func(rel string) (string, error) {
		b, err := os.ReadFile(filepath.Join(root, rel))
		return string(b), err
	}
	qrpc, err := read("lua/resty/ffi/qrpc.lua")
	if err != nil {
		return n, err
	}
	for _, m := range publicFuncRe.FindAllStringSubmatch(qrpc, -1) {
		n.Functions = append(n.Functions, m[1])
	}
	for _, m := range connMethodRe.FindAllStringSubmatch(qrpc, -1) {
		n.Functions = append(n.Functions, m[1])
	}
	// the functions not about one connection live in runtime.lua
	// (qrpc.lua re-exports them); absent in older layouts
	if rt, err := read("lua/resty/ffi/qrpc/runtime.lua"); err == nil {
		for _, m := range publicFuncRe.FindAllStringSubmatch(rt, -1) {
			n.Functions = append(n.Functions, m[1])
		}
	}
	if len(n.Functions) == 0 {
		return n, fmt.Errorf("lua/resty/ffi/qrpc.lua: no public function found (function _M.name)")
	}
	// qrpc.proto is a facade table in qrpc.lua: its keys are the public
	// part of resty.ffi.qrpc.proto.
	n.Proto, err = tableKeys(qrpc, "proto")
	if err != nil {
		return n, fmt.Errorf("lua/resty/ffi/qrpc.lua: %v: qrpc.proto's functions are read from it", err)
	}
	for _, s := range optionSources {
		src, err := read(s.file)
		if err != nil {
			return n, err
		}
		var keys []string
		if s.table == "@schema" {
			for _, m := range schemaNameRe.FindAllStringSubmatch(src, -1) {
				keys = append(keys, m[1])
			}
			if len(keys) == 0 {
				err = fmt.Errorf("no option entries (name = \"...\")")
			}
		} else {
			keys, err = tableKeys(src, s.table)
		}
		if err != nil {
			return n, fmt.Errorf("%s: %v: the %ss are read from it; update internal/docscheck if they moved", s.file, err, s.what)
		}
		n.Options = append(n.Options, keys...)
		if s.table == "keys" {
			for _, m := range nestedOptionRe.FindAllStringSubmatch(src, -1) {
				n.Options = append(n.Options, m[1]+"."+m[2])
			}
		}
	}
	n.Functions, n.Proto, n.Options = uniq(n.Functions), uniq(n.Proto), uniq(n.Options)
	return n, nil
}

func uniq(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// API checks that docs/api.md names every public function and every
// option in backticks (`name`, `qrpc.name`, `conn:name`, or `name = ...`
// inside a code span), and docs/protobuf.md every qrpc.proto function.
func API(root string) []Problem {
	names, err := ReadNames(root)
	if err != nil {
		return []Problem{{File: "lua/resty/ffi/qrpc.lua", Msg: err.Error()}}
	}
	api, err := os.ReadFile(filepath.Join(root, "docs", "api.md"))
	if err != nil {
		return []Problem{{File: "docs/api.md", Msg: "missing: it documents every function and option"}}
	}
	proto, err := os.ReadFile(filepath.Join(root, "docs", "protobuf.md"))
	if err != nil {
		return []Problem{{File: "docs/protobuf.md", Msg: "missing: it documents qrpc.proto"}}
	}
	spans := codeSpans(string(api))
	var probs []Problem
	for _, f := range names.Functions {
		if !spans["qrpc."+f] && !spans["conn:"+f] {
			probs = append(probs, Problem{File: "docs/api.md", Msg: fmt.Sprintf("function %s is not documented (want `qrpc.%s` or `conn:%s`)", f, f, f)})
		}
	}
	for _, o := range names.Options {
		if !spans[o] {
			probs = append(probs, Problem{File: "docs/api.md", Msg: fmt.Sprintf("option %s is not documented (want `%s`)", o, o)})
		}
	}
	probs = append(probs, gatewayOptions(root)...)
	pspans := codeSpans(string(proto))
	for _, f := range names.Proto {
		if !pspans["qrpc.proto."+f] {
			probs = append(probs, Problem{File: "docs/protobuf.md", Msg: fmt.Sprintf("qrpc.proto.%s is not documented (want `qrpc.proto.%s`)", f, f)})
		}
	}
	return probs
}

var (
	codeSpanRe = regexp.MustCompile("`([^`]+)`")
	spanNameRe = regexp.MustCompile(`^([A-Za-z_][\w.:]*)`)
)

// codeSpans returns the names that start a code span: `unary`, `qrpc.connect(addr)`,
// `timeout = 500` give unary, qrpc.connect, timeout.
func codeSpans(text string) map[string]bool {
	out := map[string]bool{}
	add := func(s string) {
		if n := spanNameRe.FindString(strings.TrimSpace(s)); n != "" {
			out[n] = true
			out[strings.TrimRight(n, ".:")] = true
		}
	}
	proseLines(text, func(_ int, line string) {
		for _, m := range codeSpanRe.FindAllStringSubmatch(line, -1) {
			add(m[1])
		}
	})
	return out
}

// gatewayOptions checks that docs/gateway.md names every option
// resty.ffi.qrpc.gateway accepts (the OPTIONS table of its config module)
// and the functions of the module itself.
func gatewayOptions(root string) []Problem {
	const src, conf = "lua/resty/ffi/qrpc/gateway.lua", "lua/resty/ffi/qrpc/gateway/config.lua"
	b, err := os.ReadFile(filepath.Join(root, src))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return []Problem{{File: src, Msg: err.Error()}}
	}
	var keys []string
	cb, err := os.ReadFile(filepath.Join(root, conf))
	if err == nil {
		keys, err = tableKeys(string(cb), "OPTIONS")
	}
	if err != nil {
		return []Problem{{File: conf, Msg: fmt.Sprintf("%v: the gateway options are read from it; update internal/docscheck if they moved", err)}}
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "gateway.md"))
	if err != nil {
		return []Problem{{File: "docs/gateway.md", Msg: "missing: it documents resty.ffi.qrpc.gateway"}}
	}
	spans := codeSpans(string(doc))
	var probs []Problem
	for _, k := range uniq(keys) {
		if !spans[k] {
			probs = append(probs, Problem{File: "docs/gateway.md", Msg: fmt.Sprintf("gateway option %s is not documented (want `%s`)", k, k)})
		}
	}
	for _, m := range publicFuncRe.FindAllStringSubmatch(string(b), -1) {
		if !spans["gateway."+m[1]] && !spans["gw:"+m[1]] {
			probs = append(probs, Problem{File: "docs/gateway.md", Msg: fmt.Sprintf("function %s is not documented (want `gateway.%s` or `gw:%s`)", m[1], m[1], m[1])})
		}
	}
	return probs
}
