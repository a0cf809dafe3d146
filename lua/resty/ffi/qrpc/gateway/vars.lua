-- resty.ffi.qrpc.gateway.vars: the access-log variables a gateway sets
-- when the configuration declares them (`set $qrpc_method "";`): the
-- route and method of the request, and the attempts of its call.

local ngx = ngx
local ngx_var = ngx.var

local pcall = pcall

local _M = {}

-- per worker: can ngx.var[name] be set (declared with `set` somewhere in
-- the configuration)? nil: not tried yet. An undeclared one raises, once.
local settable = {}

local function assign(name, v)
    ngx_var[name] = v
end

local function set(name, v)
    local known = settable[name]
    if known == false then
        return
    end
    local ok = pcall(assign, name, v)
    if known == nil then
        settable[name] = ok
    end
end

-- route(route): $qrpc_method and $qrpc_route of a matched route
function _M.route(route)
    set("qrpc_method", route.method)
    set("qrpc_route", route.label)
end

-- attempts(res, info): $qrpc_attempts of the call: res.attempts of an
-- answer (or of the raw answer of a bad response), else info.attempts of
-- a failed pool call; left as the configuration set it when neither gives
-- one.
function _M.attempts(res, info)
    local n = res and res.attempts
    if not n and info then
        n = info.attempts
    end
    if n then
        set("qrpc_attempts", n)
    end
end

return _M
