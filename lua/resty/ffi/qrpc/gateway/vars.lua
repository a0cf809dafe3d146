-- resty.ffi.qrpc.gateway.vars: the access-log variables a gateway sets
-- when the configuration declares them (`set $qrpc_method "";`).

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

return _M
