package nginx

import (
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/metrics"
)

// TestDeadlineExpiredLabelsBounded: qrpc_client_deadline_expired_total,
// counted in Lua, bounds its method label as Go bounds its own series'
// (cut to 128 bytes, invalid bytes replaced), so the exposition stays
// valid UTF-8 and promtool accepts it.
func TestDeadlineExpiredLabelsBounded(t *testing.T) {
	requireNginx(t)
	n := startNginx(t, ngxConf{Workers: 1, Server: metricsScrapeLoc + loc("/late", connectT+`
                for _, m in ipairs({ string.rep("m", 200), "bad\255name" }) do
                    local res, e, info = conn:unary(m, "x", { deadline = ngx.now() - 1 })
                    ngx.say(tostring(res), " ", tostring(e), " ", tostring(info and info.attempts))
                    res, e = conn:unary(m, "x")
                    ngx.say(tostring(res and res.code), " ", tostring(e))
                end`)})
	st, body := n.get("/late")
	t.Logf("/late: %d %s", st, body)
	m, text := scrape(t, n)
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "qrpc_client_deadline_expired_total{") && strings.Contains(l, strings.Repeat("m", 129)) {
			t.Errorf("method label longer than 128 bytes: %.80s...", l)
		}
	}
	if !utf8.ValidString(text) {
		t.Error("the exposition is not valid UTF-8")
	}
	for _, name := range []string{strings.Repeat("m", 200), "bad\xffname"} {
		series := `qrpc_client_deadline_expired_total{method="` + metrics.MethodLabel([]byte(name)) + `"}`
		if m[series] != 1 {
			t.Errorf("%.80q = %v, want 1", series, m[series])
		}
	}
	promtoolCheck(t, text)
}

// TestMethodLabelLuaMatchesGo: the Lua side's metrics.method_label (the
// label of qrpc_client_deadline_expired_total) gives what Go's
// metrics.MethodLabel gives for the series it records, byte for byte, on
// names made to hit the edges: invalid bytes and runs of them, overlong
// forms, surrogates, code points past U+10FFFF, truncated sequences, and
// multi-byte characters across the 128-byte cut.
func TestMethodLabelLuaMatchesGo(t *testing.T) {
	requireNginx(t)
	pieces := []string{"a", "é", "€", "😀", "\uFFFD", "\xff", "\xc0\xaf", "\xc2", "\xe0\x80\xaf",
		"\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf0\x9f\x98", "\x80", "\xbf\xbf", "\xf5\x80\x80\x80", "\n", `"`, `\`}
	names := []string{"", "greet", strings.Repeat("m", 128), strings.Repeat("m", 129), strings.Repeat("m", 200)}
	for pad := 120; pad <= 128; pad++ {
		for _, p := range pieces {
			names = append(names, strings.Repeat("x", pad)+p+p+"tail")
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var b strings.Builder
		for b.Len() < 60+r.IntN(150) {
			if r.IntN(4) == 0 {
				b.WriteByte(byte(r.IntN(256)))
			} else {
				b.WriteString(pieces[r.IntN(len(pieces))])
			}
		}
		names = append(names, b.String())
	}
	var req strings.Builder
	for _, name := range names {
		req.WriteString(hex.EncodeToString([]byte(name)) + "\n")
	}
	n := startNginx(t, ngxConf{Workers: 1, Server: loc("/label", `
                local label = require("resty.ffi.qrpc.metrics").method_label
                ngx.req.read_body()
                local out = {}
                for h in string.gmatch(ngx.req.get_body_data() or "", "([^\n]*)\n") do
                    local name = h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end)
                    out[#out + 1] = label(name):gsub(".", function(c) return string.format("%02x", c:byte()) end)
                end
                ngx.print(table.concat(out, "\n"), "\n")`),
		HTTP: "    client_body_buffer_size 4m;\n"})
	st, body, _, err := n.do("POST", "/label", req.String())
	if err != nil || st != 200 {
		t.Fatalf("/label: %d %v %.200s", st, err, body)
	}
	got := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if len(got) != len(names) {
		t.Fatalf("%d labels back for %d names", len(got), len(names))
	}
	bad := 0
	for i, name := range names {
		want := hex.EncodeToString([]byte(metrics.MethodLabel([]byte(name))))
		if got[i] != want && bad < 10 {
			bad++
			t.Errorf("name %q: Lua's label %s, Go's %s", name, got[i], want)
		}
	}
}
