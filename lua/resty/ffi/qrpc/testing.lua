-- resty.ffi.qrpc.testing: hooks for the library's own tests and
-- benchmarks. Not an API: they may change in any release.
--
--   testing.echo(body) -> body | nil, err
--       A round trip through the library and back with no network (the
--       IPC benchmark). On the built-in host it goes through the C submit
--       queue to Go's submitter goroutine and back, the hand-off a unary
--       call makes; on lua-resty-ffi, through its task queue. Yields: the
--       phases of conn:unary.
--
--   testing.view(conn) -> the table a connection object stands for (its
--       cache entry as e, its handle, its bound methods, ...), or nil.
--
-- resty.ffi.qrpc fills these in when it loads (it keeps the functions'
-- state); this module does not load it first, so that the two never
-- require each other at load time.

local require = require

local _M = {}

local function stub(body)
    require "resty.ffi.qrpc"
    if _M.echo == stub then
        return nil, "qrpc: testing.echo: resty.ffi.qrpc did not install it"
    end
    return _M.echo(body)
end
_M.echo = stub

return _M
