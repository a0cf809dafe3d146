package nginx

import (
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/schema"
)

// TestSchemaContract: every option of resty.ffi.qrpc.schema (generated
// from internal/schema) is held to what the schema says, through nginx:
// its default and bounds are accepted where it is accepted; a value past
// a bound, NaN, or a value of another type gives "bad argument #N:"
// naming it (testdata/qschema.lua).
func TestSchemaContract(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `ngx.print(require("qschema").run())`)})
	st, body := n.get("/t")
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if st != 200 || len(lines) != 1 || !strings.HasPrefix(lines[0], "checked ") {
		t.Fatalf("%d\n%s", st, body)
	}
	t.Log(lines[0])
}

// TestWireOfOptions: for each option of connect, a call and a methods
// entry, a value other than its default goes through Lua's real encoder
// (testdata/qwire.lua: the record block connect sends, the per-call and
// per-method blocks of a unary call); the records that change are among
// the ones internal/schema names for the option at that place, at least
// one when it names any, none when it names none (a fixed field or
// Lua's own), and a number or string arrives as given; besides them only
// the other fields of the same table, at their defaults. With
// TestOptionRecordsDecoded (internal/bridge: Go reads each of those
// records into what it means), Lua and Go cannot disagree on a key.
func TestWireOfOptions(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", `ngx.print(require("qwire").run())`)})
	st, body := n.get("/t")
	if st != 200 {
		t.Fatalf("%d\n%s", st, body)
	}
	tried := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			t.Fatalf("malformed line %q in\n%s", line, body)
		}
		where, name, val, res := f[0], f[1], f[2], f[3]
		var o schema.Option
		for _, x := range schema.Options {
			if x.Name == name {
				o = x
			}
		}
		want := map[string]schema.WireKey{}
		for _, k := range schema.RecordsAt(o, where) {
			want[k.Name] = k
		}
		// a field of a table (check.method) may bring the table's other
		// fields along, with their defaults
		siblings := map[string]string{}
		if top, _, ok := strings.Cut(name, "."); ok {
			for _, x := range schema.Options {
				if x.Name != name && strings.HasPrefix(x.Name, top+".") && x.Default != "" {
					for _, k := range schema.RecordsAt(x, where) {
						siblings[k.Name+"="+x.Default] = x.Name
					}
				}
			}
		}
		switch {
		case val == "-":
			continue // no value to try: required below where records carry it
		case strings.HasPrefix(res, "error: "):
			if len(want) > 0 {
				t.Errorf("%s %s = %s: %s", where, name, val, res)
			}
			continue
		}
		tried[where+" "+name] = true
		var got []string
		if res != "" {
			got = strings.Split(res, ",")
		}
		var own []string
		for _, kv := range got {
			if _, ok := want[strings.Split(kv, "=")[0]]; ok || siblings[kv] == "" {
				own = append(own, kv)
			}
		}
		if len(want) > 0 && len(own) == 0 {
			t.Errorf("%s %s = %s: no record changed, want one of %s", where, name, val, keyNames(want))
		}
		for _, kv := range own {
			k, v, _ := strings.Cut(kv, "=")
			wk, ok := want[k]
			if !ok {
				t.Errorf("%s %s = %s: Lua writes %s, but internal/schema says %s carry it", where, name, val, kv, keyNames(want))
				continue
			}
			if len(own) > 1 || strings.Contains(v, "|") {
				continue
			}
			x, xerr := strconv.ParseFloat(val, 64)
			y, yerr := strconv.ParseFloat(v, 64)
			if (wk.Type == schema.Str && v != val && val != "table") || (wk.Type != schema.Str && xerr == nil && (yerr != nil || x != y)) {
				t.Errorf("%s %s = %s arrives as %s", where, name, val, kv)
			}
		}
	}
	for _, o := range schema.Options {
		for _, where := range o.Where {
			if len(schema.RecordsAt(o, where)) > 0 && !tried[where+" "+o.Name] {
				t.Errorf("%s %s: carried by records, but qwire.lua tried no value (give it a sample)", where, o.Name)
			}
		}
	}
}

func keyNames(m map[string]schema.WireKey) string {
	var names []string
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "none (a fixed field or Lua's own)"
	}
	return strings.Join(names, ", ")
}
