-- resty.ffi.qrpc.resty_ffi: the lua-resty-ffi host (a rebuilt nginx with
-- ngx.load_ffi). unary and the testing echo go to Go as lua-resty-ffi tasks:
-- the calling light thread yields in rt:call until Go answers. connect
-- dials through the built-in host's completion queue (cache.lua says why);
-- the other operations never wait and use the built-in host's direct calls.

local ffi = require "ffi"
local abi = require "resty.ffi.qrpc.abi"
local builtin = require "resty.ffi.qrpc.host_builtin"

local ffi_string = ffi.string
local ffi_cast = ffi.cast

local ngx_now = ngx.now
local ngx_sleep = ngx.sleep
local thread_spawn = ngx.thread.spawn
local thread_kill = ngx.thread.kill

local type = type
local tostring = tostring
local pairs = pairs
local pcall = pcall

local QRPC_OK = abi.QRPC_OK
local QRPC_BAD_RESPONSE = abi.QRPC_BAD_RESPONSE
local QRPC_ERR = abi.QRPC_ERR
local CMD_SIZE = abi.CMD_SIZE
local cstr_t = abi.cstr_t
local status_err = abi.status_err
local decode_result = abi.decode_result
local decode_bad_response = abi.decode_bad_response

local SWEEP_EVERY_S = builtin.SWEEP_EVERY_S
local PIN_GRACE_S = 60
-- How often a keeper light thread (see call) looks whether its call is done.
local KEEP_POLL_S = 0.05


local _M = {}


local rt                -- the runtime ngx.load_ffi returned
local waiting

-- Called once the library is loaded with this host.
function _M.init(r)
    rt = r
    builtin.hold(waiting)
end


-- The command points into Lua strings; Go may read them until the task is
-- answered, even if the calling light thread is killed meanwhile. They stay
-- referenced here until the call returns or, for abandoned calls, well past
-- the deadline Go enforces.
-- pinned[key] = { cmd, a, b, c, deadline, expiry }: by its deadline (secs,
-- Go's deadline plus slack) the call has been answered.
local pinned = {}
local pin_seq = 0
local last_pin_sweep = 0

local function pin(cmd, c, secs)
    local now = ngx_now()
    if now - last_pin_sweep >= SWEEP_EVERY_S then
        last_pin_sweep = now
        for k, v in pairs(pinned) do
            if v[6] < now then
                pinned[k] = nil
            end
        end
    end
    pin_seq = pin_seq + 1
    local deadline = now + secs
    pinned[pin_seq] = { cmd, c, false, false, deadline, deadline + PIN_GRACE_S }
    return pin_seq
end


-- Calls whose coroutine waits in lua-resty-ffi. A coroutine that was killed
-- (ngx.thread.kill, a client abort) never comes back to unpin its call and
-- lua-resty-ffi tells nobody: such a call counts until its deadline.
waiting = function()
    local now = ngx_now()
    local n = 0
    for _, v in pairs(pinned) do
        if v[5] >= now then
            n = n + 1
        end
    end
    return n
end
_M.waiting = waiting


-- Keeps the worker alive while call key is pinned (see call).
local function keep(key)
    local v = pinned[key]
    while v and pinned[key] == v and ngx_now() < v[5] do
        ngx_sleep(KEEP_POLL_S)
    end
end


-- Sends cmd as a lua-resty-ffi task; c is the command table it was
-- filled from (abi.fill_cmd), which holds every string its pointers lead
-- into. Returns status, response string | error.
--
-- While the coroutine waits in lua-resty-ffi, something must keep an nginx
-- timer pending, or an exiting worker (reload, quit) leaves at once and
-- cuts the request. The dispatcher does (builtin.hold); once the worker
-- exits and the dispatcher has stopped, ngx.timer.at is refused, so a light
-- thread of the caller's own sleeps until the call returns.
function _M.call(cmd, c, secs)
    local key = pin(cmd, c, secs)
    local keeper
    if not builtin.ensure_dispatcher() then
        local ok, th = pcall(thread_spawn, keep, key)
        if ok then
            keeper = th
        end
    end
    local ok, x, y = rt:call(ffi_string(cmd, CMD_SIZE))
    pinned[key] = nil
    if keeper then
        thread_kill(keeper)
    end
    if ok then
        return QRPC_OK, x
    end
    if type(x) == "number" then
        return x, status_err(x, y)
    end
    -- lua-resty-ffi's own refusal ("post failed, queue full", ...)
    return QRPC_ERR, "qrpc: lua-resty-ffi: " .. tostring(x)
end


-- Turns an OK result blob into a table.
function _M.decode(status, val, info)
    if status == QRPC_BAD_RESPONSE then
        return status, decode_bad_response(ffi_cast(cstr_t, val), #val)
    end
    if status == QRPC_OK then
        val = decode_result(ffi_cast(cstr_t, val), #val)
        if not val then
            return QRPC_ERR, "qrpc: malformed result from the library"
        end
    end
    return status, val, info
end


return _M
