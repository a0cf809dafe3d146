package docscheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// tree writes files under a new git repository and returns its root.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, text := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("git", "init", "-q", root).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	return root
}

func run(t *testing.T, root string, check func(string, []string) []Problem) []string {
	t.Helper()
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range check(root, files) {
		out = append(out, p.String())
	}
	return out
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Quick start: two commands":                 "quick-start-two-commands",
		"qrpc.debug_profile":                        "qrpcdebug_profile",
		"`conn:unary`":                              "connunary",
		"Where the module looks for libffi_qrpc.so": "where-the-module-looks-for-libffi_qrpcso",
		"Several servers (pools)":                   "several-servers-pools",
		"conn:stats, qrpc.stats":                    "connstats-qrpcstats",
	} {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLinks(t *testing.T) {
	root := tree(t, map[string]string{
		"README.md": "# Top\n\n## Same\n\n## Same\n\n[a](docs/a.md#part-two) [b](#same-1) [c](https://x.invalid/#nope)\n" +
			"```\n[not a link](nowhere.md)\n```\n`[code](nowhere.md)`\n",
		"docs/a.md": "# A\n\n## Part two\n\n<a id=\"custom\"></a>\n[up](../README.md#top) [c](#custom) [dir](../docs)\n",
	})
	if got := run(t, root, Links); len(got) != 0 {
		t.Fatalf("a tree whose links all resolve: %v", got)
	}
	for name, text := range map[string]string{
		"missing file":   "[x](docs/b.md)\n",
		"missing anchor": "[x](docs/a.md#part-three)\n",
		"local anchor":   "[x](#nowhere)\n",
		"outside":        "[x](../elsewhere.md)\n",
	} {
		if err := os.WriteFile(filepath.Join(root, "docs", "broken.md"), []byte("# B\n"+text), 0o644); err != nil {
			t.Fatal(err)
		}
		got := run(t, root, Links)
		if len(got) != 1 || !strings.HasPrefix(got[0], "docs/broken.md:2: link") {
			t.Errorf("%s: got %v, want one problem on docs/broken.md:2", name, got)
		}
	}
}

func TestHistory(t *testing.T) {
	clean := map[string]string{
		"a.go":      "// The deadline heap keeps calls by deadline (golang/go#15538 is upstream).\n",
		"b.md":      "bad argument #2: method must be a string; see openresty/openresty#1022\n",
		"c_test.go": "// a session ticket is a TLS session resumption key\n",
	}
	root := tree(t, clean)
	if got := run(t, root, History); len(got) != 0 {
		t.Fatalf("no history in %v, got %v", clean, got)
	}
	for _, line := range []string{
		// Spelt in two pieces, so that a grep of the tree for these
		// phrases finds none here either.
		"// measured in sess" + "ion 9's run",
		"Session" + " 21's two full runs",
		"# as this " + "session found",
		"see iss" + "ue 13",
		"(iss" + "ues 5 and 13)",
		"the earlier runs gave 1.2",
		"when this line was written",
		"against the previous design",
	} {
		if err := os.WriteFile(filepath.Join(root, "d.txt"), []byte("ok\n"+line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		got := run(t, root, History)
		if len(got) != 1 || !strings.HasPrefix(got[0], "d.txt:2: history") {
			t.Errorf("%q: got %v", line, got)
		}
	}
}

func TestReadmeLength(t *testing.T) {
	root := tree(t, map[string]string{"README.md": strings.Repeat("x\n", MaxReadmeLines)})
	if p := ReadmeLength(root); len(p) != 0 {
		t.Fatalf("%d lines: %v", MaxReadmeLines, p)
	}
	root = tree(t, map[string]string{"README.md": strings.Repeat("x\n", MaxReadmeLines+1)})
	if p := ReadmeLength(root); len(p) != 1 {
		t.Fatalf("%d lines: %v", MaxReadmeLines+1, p)
	}
}

const luaSchema = `
return {
    { name = "server_name", type = "string",
      doc = "a = 1" },
    { name = "conns", type = "integer" },
    { name = "timeout", type = "number" },
    { name = "headers", type = "table" },
    { name = "host", type = "string" },
    { name = "lib", type = "string" },
}
`

const luaRuntime = `
function _M.configure(opts) end
`

const luaQrpc = `
local _M = {
    proto = {
        load = proto.load,
        empty_array = proto.empty_array,
    },
}
function _M.connect(addr, opts) end
function methods.unary(self, method) end
function _M._echo(body) end
`

const luaPool = `
local _M = {
    keys = {
        balance = true, health = true,
    },
}
local function f(health) return health.failures end
`

func apiTree(t *testing.T, api, proto string) string {
	return tree(t, map[string]string{
		"lua/resty/ffi/qrpc.lua":         luaQrpc,
		"lua/resty/ffi/qrpc/schema.lua":  luaSchema,
		"lua/resty/ffi/qrpc/runtime.lua": luaRuntime,
		"lua/resty/ffi/qrpc/pool.lua":    luaPool,
		"docs/api.md":                    api,
		"docs/protobuf.md":               proto,
	})
}

func TestAPI(t *testing.T) {
	api := "`qrpc.connect(addr)`, `qrpc.configure` and `conn:unary`; options `server_name`, `conns`, `timeout`, `headers`,\n" +
		"`host`, `lib`, `balance`, `health`, `health.failures = 3`\n"
	proto := "`qrpc.proto.load(path)`, `qrpc.proto.empty_array`\n"
	root := apiTree(t, api, proto)
	names, err := ReadNames(root)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names.Options, ","); got != "balance,conns,headers,health,health.failures,host,lib,server_name,timeout" {
		t.Errorf("options read: %s", got)
	}
	if got := strings.Join(names.Functions, ","); got != "configure,connect,unary" {
		t.Errorf("functions read: %s", got)
	}
	if p := API(root); len(p) != 0 {
		t.Fatalf("everything documented: %v", p)
	}
	// An option left out of the docs, a function, a proto function.
	for _, c := range []struct{ api, proto, want string }{
		{strings.Replace(api, "`conns`, ", "", 1), proto, "option conns"},
		{strings.Replace(api, "`health.failures = 3`", "", 1), proto, "option health.failures"},
		{strings.Replace(api, "`conn:unary`", "unary", 1), proto, "function unary"},
		{api, "`qrpc.proto.load(path)`", "qrpc.proto.empty_array"},
	} {
		p := API(apiTree(t, c.api, c.proto))
		if len(p) != 1 || !strings.Contains(p[0].Msg, c.want) {
			t.Errorf("want one problem naming %s, got %v", c.want, p)
		}
	}
	// The options' table renamed: the check says so instead of passing.
	root = tree(t, map[string]string{
		"lua/resty/ffi/qrpc.lua":         luaQrpc,
		"lua/resty/ffi/qrpc/schema.lua":  "return {}\n",
		"lua/resty/ffi/qrpc/runtime.lua": luaRuntime,
		"lua/resty/ffi/qrpc/pool.lua":    luaPool,
		"docs/api.md":                    api,
		"docs/protobuf.md":               proto,
	})
	if p := API(root); len(p) != 1 || !strings.Contains(p[0].Msg, `no option entries`) {
		t.Errorf("renamed option table: %v", p)
	}
}

// The repository itself passes every check (make lint runs the same).
func TestRepository(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files, err := Files(root)
	if err != nil {
		t.Skip("not a git checkout:", err)
	}
	var probs []Problem
	probs = append(probs, ReadmeLength(root)...)
	probs = append(probs, Links(root, files)...)
	probs = append(probs, History(root, files)...)
	probs = append(probs, API(root)...)
	for _, p := range probs {
		t.Error(p)
	}
}
