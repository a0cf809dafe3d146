package nginx

import (
	"bytes"
	"encoding/hex"
	"math/rand"
	"strings"
	"testing"
	"unicode/utf8"
)

// goClean is what Go's encoding/json writes for s: every byte that starts
// no valid sequence becomes U+FFFD, the rest stays.
func goClean(s []byte) []byte {
	var out bytes.Buffer
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			out.WriteString("\uFFFD")
		} else {
			out.Write(s[:size])
		}
		s = s[size:]
	}
	return out.Bytes()
}

// TestGatewayUTF8: resty.ffi.qrpc.gateway.utf8 agrees with Go on what is
// UTF-8 (the check a proto3 string gets: no overlong form, no surrogate,
// nothing above U+10FFFF, no cut sequence) and on how an error body
// writes the rest, over the edges of each sequence length and random
// bytes from a fixed seed.
func TestGatewayUTF8(t *testing.T) {
	t.Parallel()
	n := startNginx(t, ngxConf{
		Workers: 1,
		Server: `
        location = /utf8 { client_body_buffer_size 1m; content_by_lua_block {
            local u = require "resty.ffi.qrpc.gateway.utf8"
            ngx.req.read_body()
            local out = {}
            for line in string.gmatch(ngx.req.get_body_data() or "", "([^\n]*)\n") do
                local s = line:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)
                local c = u.clean(s):gsub(".", function(ch) return string.format("%02x", ch:byte()) end)
                out[#out + 1] = (u.valid(s) and "1 " or "0 ") .. c
            end
            ngx.print(table.concat(out, "\n"), "\n")
        } }`,
	})
	cases := [][]byte{
		{}, []byte("image/png"), []byte("caf\xc3\xa9"), []byte("\xef\xbf\xbd"),
		{0x7f}, {0x80}, {0xbf}, {0xc0, 0x80}, {0xc1, 0xbf}, {0xc2, 0x80}, {0xdf, 0xbf}, {0xc2}, {0xc2, 0x41},
		{0xe0, 0x9f, 0xbf}, {0xe0, 0xa0, 0x80}, {0xed, 0x9f, 0xbf}, {0xed, 0xa0, 0x80}, {0xed, 0xbf, 0xbf},
		{0xee, 0x80, 0x80}, {0xef, 0xbf, 0xbf}, {0xe2, 0x82}, {0xe2, 0x82, 0x41},
		{0xf0, 0x8f, 0xbf, 0xbf}, {0xf0, 0x90, 0x80, 0x80}, {0xf4, 0x8f, 0xbf, 0xbf}, {0xf4, 0x90, 0x80, 0x80},
		{0xf5, 0x80, 0x80, 0x80}, {0xf8, 0x88, 0x80, 0x80, 0x80}, {0xfe}, {0xff, 0x00}, {0xf0, 0x9f, 0x98},
		[]byte("a\xffb\xc3\xa9c\xed\xa0\x80d"),
	}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 500; i++ {
		b := make([]byte, rng.Intn(12))
		for j := range b {
			// mostly bytes that start or continue a sequence
			b[j] = byte(0x80 + rng.Intn(0x80))
			if rng.Intn(4) == 0 {
				b[j] = byte(rng.Intn(0x80))
			}
		}
		cases = append(cases, b)
	}
	var body strings.Builder
	for _, c := range cases {
		body.WriteString(hex.EncodeToString(c) + "\n")
	}
	status, got, _, err := n.do("POST", "/utf8", body.String())
	if err != nil || status != 200 {
		t.Fatalf("%d %v %s", status, err, got)
	}
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) != len(cases) {
		t.Fatalf("%d answers for %d cases", len(lines), len(cases))
	}
	for i, c := range cases {
		want := "0 "
		if utf8.Valid(c) {
			want = "1 "
		}
		want += hex.EncodeToString(goClean(c))
		if lines[i] != want {
			t.Errorf("%x: valid, clean: got %q, want %q (Go's)", c, lines[i], want)
		}
	}
}
