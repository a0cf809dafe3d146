package limits

import (
	"fmt"
	"strings"
)

// LuaPath is where the Lua copy lives, from the repository's root.
const LuaPath = "lua/resty/ffi/qrpc/limits.lua"

// LuaSource is limits.lua as make limits writes it.
func LuaSource() []byte {
	var b strings.Builder
	b.WriteString(`-- resty.ffi.qrpc.limits: the bounds Lua checks before Go checks them
-- again. Generated from internal/limits/limits.go by "make limits": do not
-- edit (make lint fails when the two differ).

return {
`)
	for _, l := range Lua {
		fmt.Fprintf(&b, "    %s = %d,\n", l.Name, l.Value)
	}
	b.WriteString("    -- Go's defaults (qrpc.Config), for the connection cache\n")
	for _, d := range Defaults {
		fmt.Fprintf(&b, "    %s = %d,\n", d.Name, d.Value)
	}
	b.WriteString("}\n")
	return []byte(b.String())
}
