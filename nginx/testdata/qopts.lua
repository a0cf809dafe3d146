-- qopts: options tables for the schema tests (qschema, qwire): an
-- option's value set by its schema name ("a" or "a.b"), and the option
-- it needs given as well.

local schema = require "resty.ffi.qrpc.schema"

local _M = {}

local by_name = {}
for _, o in ipairs(schema) do
    by_name[o.name] = o
end
_M.by_name = by_name

-- set(t, name, v): t's option name (maybe "a.b") set to v; returns t
function _M.set(t, name, v)
    local a, b = name:match("^(%w+)%.([%w_]+)$")
    if a then
        t[a] = t[a] or {}
        t[a][b] = v
    else
        t[name] = v
    end
    return t
end

-- needs(t, name): the option that option name needs, set in t; returns t
function _M.needs(t, name)
    local n = by_name[name] and by_name[name].needs or ""
    if n ~= "" then
        _M.set(t, n, by_name[n].type == "string" and "echo" or 10)
    end
    return t
end

return _M
