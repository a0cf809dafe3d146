-- luarocks make rockspec/lua-resty-ffi-qrpc-0.1.0-1.rockspec
--
-- Builds libffi_qrpc.so with the Go toolchain (Go 1.26+, `go` on PATH or
-- at /usr/local/go/bin/go, or GO=/path/to/go) through the Makefile, then
-- installs:
--   resty/ffi/qrpc.lua    -> <tree>/share/lua/5.1/resty/ffi/qrpc.lua
--   resty/ffi/qrpc/*.lua  -> <tree>/share/lua/5.1/resty/ffi/qrpc/ (cdef,
--                            loader, builtin, resty_ffi, cache)
--   libffi_qrpc.so        -> <tree>/lib/lua/5.1/libffi_qrpc.so
-- Works offline from a checkout once the Go module cache holds the
-- dependencies (`go mod download` while online).
rockspec_format = "3.0"
package = "lua-resty-ffi-qrpc"
version = "0.1.0-1"

source = {
   url = "git+https://github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc.git",
   tag = "v0.1.0",
}

description = {
   summary = "qrpc (RPC over QUIC) client for OpenResty / nginx Lua, built in Go",
   detailed = [[
A non-blocking qrpc client for nginx Lua: the protocol runs in Go (quic-go)
inside libffi_qrpc.so, loaded with LuaJIT FFI in each worker. Works on stock
OpenResty or nginx + ngx_lua + lua-resty-core, and through lua-resty-ffi.
]],
   homepage = "https://github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc",
   license = "MIT",
   labels = { "openresty", "nginx", "quic", "rpc", "ffi" },
}

dependencies = {
   "lua >= 5.1",
}

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
