package nginx

import (
	"strings"
	"testing"
)

// api.md: connect's string options are checked in Lua. An empty string
// (an unset environment variable, most often) in ca or server_name was
// taken for "not given": the system roots, the host of addr, so a
// connect could verify against another trust than the caller's. Every
// string of connect's options where "" means nothing is refused; the
// ones refused before stay refused with their words.
func TestConnectEmptyStrings(t *testing.T) {
	n := startNginx(t, ngxConf{Workers: 1, HTTP: "lua_shared_dict cempty 1m;", Server: loc("/t", `
                local qrpc = require "resty.ffi.qrpc"
                local qt = require "qtest"
                local function say(conn, err)
                    ngx.say(conn and "connected" or err)
                    if conn then conn:close() end
                end
                say(qrpc.connect(qt.addr, { ca = "", server_name = "localhost" }))
                say(qrpc.connect(qt.addr, { ca = qt.ca, server_name = "" }))
                say(qt.connect({ ca = "" }))
                say(qt.connect({ server_name = "" }))
                say(qt.connect({ cert = "", key = "" }))
                say(qt.connect({ cert = qt.cert, key = "" }))
                say(qt.connect({ cert = "", key = qt.key }))
                say(qt.connect({ insecure = true, ca = "" }))
                say(qt.connect({ balance = "" }))
                say(qt.connect({ resolver = "" }))
                say(qt.connect({ check = { method = "" } }))
                say(qt.connect({ shared = "" }))
                say(qt.connect({ shared = { dict = "" } }))
                say(qt.connect({ shared = { dict = "cempty", name = "" } }))
                say(qt.connect({ pins = { "" } }))
                say(qt.connect({ propagate = { "" } }))
                say(qt.connect({ health = { on = { "" } } }))
                say(qt.connect({ methods = { M = { request = "" } } }))
                say(qt.connect({ methods = { M = { response = "" } } }))
                say(qt.connect())`)})
	_, body := n.get("/t")
	want := []string{
		"bad argument #2: ca must not be empty",
		"bad argument #2: server_name must not be empty",
		"bad argument #2: ca must not be empty",
		"bad argument #2: server_name must not be empty",
		"bad argument #2: cert must not be empty",
		"bad argument #2: key must not be empty",
		"bad argument #2: cert must not be empty",
		"bad argument #2: ca must not be empty",
		`bad argument #2: balance must be "round_robin", "least_inflight", "hash" or "p2c" (got )`,
		"bad argument #2: resolver must be a string host:port",
		"bad argument #2: check.method must be a method name",
		"bad argument #2: shared must be the name of a lua_shared_dict",
		"bad argument #2: shared.dict must be the name of a lua_shared_dict",
		"bad argument #2: shared.name must be a non-empty string of at most 128 characters without spaces",
		"bad argument #2: pins[1] must be a SHA-256 digest in hex (64 digits) or base64 (44 characters)",
		"bad argument #2: propagate[1] must be a header name (got )",
		`bad argument #2: health.on must be a list of "connect", "reset", "timeout" (got )`,
		`bad argument #2: methods.M.request must be a message name like "pkg.Msg"`,
		`bad argument #2: methods.M.response must be a message name like "pkg.Msg"`,
		"connected",
	}
	got := strings.Split(strings.TrimSpace(body), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("messages:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
