-- The rockspec as published on luarocks.org. Users run
--     luarocks install lua-resty-ffi-qrpc
-- which fetches the source rock (this file + the release tarball below) or,
-- on linux-x86_64, the prebuilt binary rock. From a checkout:
--     luarocks make rockspec/lua-resty-ffi-qrpc-0.1.0-1.rockspec
-- (luarocks make builds the checkout and ignores `source`).
--
-- Building (source rock, checkout) runs the Makefile: Go 1.26+ (`go` on PATH
-- or at /usr/local/go/bin/go, or GO=/path/to/go), gcc and make. It installs
--   resty/ffi/qrpc.lua (and resty/ffi/qrpc/**/*.lua) -> <tree>/share/lua/5.1/
--   libffi_qrpc.so                               -> <tree>/lib/lua/5.1/
--   qrpc.h (the C ABI)                           -> the rock's own directory,
--                                                   include/ (luarocks show --rock-dir)
-- The release tarball (`make dist`) carries its Go dependencies in vendor/:
-- a source-rock install needs no network beyond the rocks server.
rockspec_format = "3.0"
package = "lua-resty-ffi-qrpc"
version = "0.1.0-1"

source = {
   -- `make dist` output, uploaded as an asset of the GitHub release v0.1.0.
   url = "https://github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/releases/download/v0.1.0/lua-resty-ffi-qrpc-0.1.0.tar.gz",
   dir = "lua-resty-ffi-qrpc-0.1.0",
}

description = {
   summary = "qrpc (RPC over QUIC) client for OpenResty / nginx Lua, built in Go",
   detailed = [[
A non-blocking qrpc client for nginx Lua: the protocol runs in Go (quic-go)
inside libffi_qrpc.so, loaded with LuaJIT FFI in each worker. Works on stock
OpenResty or nginx + ngx_lua + lua-resty-core, and through lua-resty-ffi.

Not declared as dependencies because they are not rocks: ngx_lua (an nginx
module: use OpenResty, or e.g. Debian's libnginx-mod-http-lua) and
lua-resty-core (shipped with OpenResty, or Debian's lua-resty-core; it must
match the ngx_lua version). The module runs only inside nginx with them,
on LuaJIT (it uses the LuaJIT FFI), on Linux.

Building from the source rock needs Go 1.26+ (the version in go.mod), gcc
and make, but no network: Go dependencies are vendored in the tarball. The
linux-x86_64 binary rock needs none of them.
]],
   homepage = "https://github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc",
   license = "MIT",
   labels = { "openresty", "nginx", "quic", "rpc", "ffi" },
}

-- LuaJIT, as in nginx, reports itself as Lua 5.1.
dependencies = {
   "lua ~> 5.1",
}

supported_platforms = { "linux" }

build = {
   type = "make",
   -- The default target builds the library; `install` copies it and the
   -- Lua files into the rock's directories, which luarocks then deploys.
   build_target = "all",
   install_target = "install",
   -- Unused by the Go build; passed so that luarocks does not warn.
   build_variables = { CFLAGS = "$(CFLAGS)" },
   install_variables = {
      PREFIX = "$(PREFIX)",
      LUA_LIB_DIR = "$(LUADIR)",
      LIB_DIR = "$(LIBDIR)",
   },
}
