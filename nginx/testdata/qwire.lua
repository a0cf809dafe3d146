-- qwire: for each option of resty.ffi.qrpc.schema accepted by connect, a
-- call or a methods entry, sends a value other than its default through
-- Lua's real encoder and reports the records that changed against the
-- same options without it (the option it needs given in both). One line
-- per try, tab-separated: place, option, value, then the changed records
-- as KEY=value (comma-separated; a repeated record's values joined by
-- "|"), or "error: ..." when it was refused, or "-" for no value to
-- try. TestWireOfOptions compares them with the record keys
-- internal/schema names for the option.

local schema = require "resty.ffi.qrpc.schema"
local wire = require "resty.ffi.qrpc.wire"
local pool = require "resty.ffi.qrpc.pool"
local testing = require "resty.ffi.qrpc.testing"
local qt = require "qtest"

local _M = {}

local qopts = require "qopts"
local set, needs = qopts.set, qopts.needs

-- Values no bound gives (strings, lists, tables), or one the bounds
-- would not pick.
local samples = {
    balance = { "p2c" },
    ["check.method"] = { "echo" },
    resolver = { "127.0.0.1:53" },
    ["health.on"] = { { "reset" } },
    throttle = { { k = 2, codes = { 503 } } },
    ["hedge.delay"] = { 5, "p95" },
    propagate = { { "x-id" } },
}

-- values of o to try: a sample, else the lowest in bounds that is not
-- the default, else a boolean other than the default
local function values(o)
    if samples[o.name] then
        return samples[o.name]
    end
    if o.min then
        for _, v in ipairs({ o.min, o.min + 1, o.max }) do
            if v <= o.max and not (o.min_open and v == o.min)
               and tostring(v) ~= o.default
            then
                return { v }
            end
        end
    end
    if o.type == "boolean" then
        return { o.default ~= "true" }
    end
    return {}
end

local function records(s)
    local ks, vs = assert(wire.decode(s or ""))
    local out = {}
    for i = 1, #ks do
        local name = wire.keys.names[ks[i]]
        local v = vs[i]
        if type(v) == "number" then
            v = string.format("%.17g", v)
        end
        out[name] = out[name] and (out[name] .. "|" .. v) or v
    end
    return out
end

-- "KEY=v,..." for the records of block whose values are not those of base
local function changed(base, block)
    local b, a = records(base), records(block)
    local out = {}
    for k, v in pairs(a) do
        if b[k] ~= v then
            out[#out + 1] = k .. "=" .. v
        end
    end
    table.sort(out)
    return table.concat(out, ",")
end

local function fmt(v)
    if type(v) == "number" then
        return string.format("%.17g", v)
    end
    return tostring(v)
end

-- the block each place sends for opts, or nil, err
local encode = {
    connect = function(opts)
        local conn, err = qt.connect(opts)
        if not conn then
            return nil, err
        end
        return testing.view(conn).e.opts
    end,
    call = function(opts)
        local conn = assert(qt.connect({ retries = 0 }))
        local ok, err, _, copts = pool.call_opts(testing.view(conn), opts, 4, nil)
        if not ok then
            return nil, err
        end
        return copts or ""
    end,
    method = function(opts)
        local conn, err = qt.connect({ retries = 0, methods = { echo = opts } })
        if not conn then
            return nil, err
        end
        return testing.view(conn).methods.echo.copts or ""
    end,
}

function _M.run()
    local out = {}
    for _, o in ipairs(schema) do
        for _, where in ipairs({ "connect", "call", "method" }) do
            if o.where[where] then
                local vals = values(o)
                if #vals == 0 then
                    out[#out + 1] = where .. "\t" .. o.name .. "\t-\t-"
                end
                for _, v in ipairs(vals) do
                    -- connect: retries = 0 makes Lua write every pool record
                    -- in both, so that only what v changes differs
                    local base = needs(where == "connect" and { retries = 0 } or {}, o.name)
                    local opts = needs(where == "connect" and { retries = 0 } or {}, o.name)
                    set(opts, o.name, v)
                    local b, berr = encode[where](base)
                    local a, aerr = encode[where](opts)
                    local res
                    if b == nil or a == nil then
                        res = "error: " .. tostring(berr or aerr)
                    else
                        res = changed(b, a)
                    end
                    out[#out + 1] = where .. "\t" .. o.name .. "\t" .. fmt(v) .. "\t" .. res
                end
            end
        end
    end
    return table.concat(out, "\n") .. "\n"
end

return _M
