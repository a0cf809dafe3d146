package nginx

import (
	"strings"
	"testing"
)

// TestEventsRefuseAnswerOptions: an event has no answer, so the options
// of one are refused with "bad argument" rather than ignored:
// proto_names, and json = "response" (the one value of json about the
// answer alone); the request's own json values still go.
func TestEventsRefuseAnswerOptions(t *testing.T) {
	requireNginx(t)
	t.Parallel()
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/t", connectT+`
                local function p(a, b) ngx.say(tostring(a), " ", tostring(b)) end
                p(conn:event("count", "x", { proto_names = true }))
                p(conn:event("count", "x", { proto_names = false }))
                p(conn:event("count", "x", { json = "response" }))
                p(conn:event("count", "x", { json = "response", request = "demo.HelloRequest" }))
                p(conn:event("count", "x", { json = "request" }))
                p(conn:event("count", "x", { json = false }))`)})
	st, body := n.get("/t")
	want := strings.Join([]string{
		`nil bad argument #4: option 'proto_names' does not apply to events`,
		`nil bad argument #4: option 'proto_names' does not apply to events`,
		`nil bad argument #4: json = "response" does not apply to events`,
		`nil bad argument #4: json = "response" does not apply to events`,
		`true nil`,
		`true nil`,
	}, "\n") + "\n"
	if st != 200 || body != want {
		t.Fatalf("%d\n%s\nwant\n%s", st, body, want)
	}
}
