package nginx

import (
	"strings"
	"testing"
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
