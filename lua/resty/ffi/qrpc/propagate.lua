-- Trace context: connect's opts.propagate = { "traceparent", ... } copies
-- those headers of the current HTTP request into each call's qrpc headers
-- when the caller did not set them. Nothing is copied where there is no
-- request (timers, init_worker, the stream subsystem).

local ngx = ngx
local ngx_var = ngx.var
local get_phase = ngx.get_phase

local type = type
local pairs = pairs
-- never a caller's __tostring (abi.show)
local tostring = require("resty.ffi.qrpc.abi").show
local str_lower = string.lower
local str_gsub = string.gsub
local str_find = string.find
local new_tab = require("resty.core.base").new_tab

local _M = {}

-- Phases that have a request whose headers ngx.var can read: none in
-- the stream subsystem (a TCP/UDP session has no HTTP headers).
local request_phases = {
    set = true, rewrite = true, server_rewrite = true, access = true,
    content = true, header_filter = true, body_filter = true, log = true,
}
if ngx.config and ngx.config.subsystem == "stream" then
    request_phases = {}
end

-- check validates opts.propagate; it returns the list the connection keeps
-- ({ { name = "traceparent", var = "http_traceparent" }, ... }), or nil
-- and an error message (without the "bad argument" prefix).
function _M.check(list)
    local n, count = #list, 0
    for _ in pairs(list) do
        count = count + 1
    end
    if count ~= n or n == 0 then
        return nil, "propagate must be a non-empty list of header names"
    end
    local out = new_tab(n, 0)
    for i = 1, n do
        local name = list[i]
        if type(name) ~= "string" or not str_find(name, "^[%w%-_]+$") then
            return nil, "propagate[" .. i .. "] must be a header name (got "
                        .. tostring(name) .. ")"
        end
        local lower = str_lower(name)
        out[i] = { name = lower, var = "http_" .. str_gsub(lower, "-", "_") }
    end
    return out
end

-- has reports whether headers (a caller's { name = value }) sets name,
-- whatever its case.
local function has(headers, name)
    if headers[name] ~= nil then
        return true
    end
    for k in pairs(headers) do
        if type(k) == "string" and str_lower(k) == name then
            return true
        end
    end
    return false
end

-- apply returns the headers a call sends: the caller's, plus the
-- propagated request headers they lack. The caller's table is never
-- modified; it is returned as is when there is nothing to add.
function _M.apply(prop, headers)
    if not request_phases[get_phase()] then
        return headers
    end
    local out
    for i = 1, #prop do
        local p = prop[i]
        local v = ngx_var[p.var]
        if v and not (headers and has(headers, p.name)) then
            if not out then
                out = new_tab(0, 4)
                if headers then
                    for k, hv in pairs(headers) do
                        out[k] = hv
                    end
                end
            end
            out[p.name] = v
        end
    end
    return out or headers
end

return _M
