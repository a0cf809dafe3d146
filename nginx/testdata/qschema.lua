-- qschema: passes each numeric option of resty.ffi.qrpc.schema through
-- the API where the schema says it is accepted: its default, each bound
-- and the values past each bound; and a value of the wrong type for every
-- option. Reports each answer that differs from what the schema promises:
-- in bounds, no "bad argument"; past them or of another type,
-- "bad argument #N: <name> ...".

local qrpc = require "resty.ffi.qrpc"
local schema = require "resty.ffi.qrpc.schema"
local qt = require "qtest"

local _M = {}

local qopts = require "qopts"

-- opts with name (maybe "a.b") set to v, and the option it needs
local function with(name, v)
    return qopts.needs(qopts.set({}, name, v), name)
end

local function refused(err, argn, name)
    local top = name:match("^(%w+)%.") or name
    return type(err) == "string"
        and err:find("bad argument #" .. argn .. ": ", 1, true) == 1
        and (err:find(name, 1, true) or err:find(top, 1, true)) ~= nil
end

function _M.run()
    local out, checked = {}, 0
    local conn = assert(qt.connect())
    local gp = qrpc.stats().gomaxprocs
    local function try(o, where, v, want_ok)
        local ok, err
        if where == "connect" then
            -- a server nothing listens on: no dial is kept
            local opts = with(o.name, v)
            opts.timeout = opts.timeout or 200
            local c
            c, err = qrpc.connect("127.0.0.1:1", opts)
            ok = c ~= nil or not (err or ""):find("^bad argument")
            if c then c:close() end
            if not want_ok then ok = refused(err, 2, o.name) and true or false end
        elseif where == "call" then
            local res
            res, err = conn:unary("echo", "x", with(o.name, v))
            ok = res ~= nil or not (err or ""):find("^bad argument")
            if not want_ok then ok = refused(err, 4, o.name) and true or false end
        elseif where == "configure" then
            ok, err = qrpc.configure(with(o.name, v))
            if not want_ok then ok = refused(err, 1, o.name) and true or false
            else ok = ok == true end
            qrpc.configure({ max_connections = 256, gomaxprocs = gp })
        else
            return
        end
        checked = checked + 1
        if not ok then
            out[#out + 1] = where .. " " .. o.name .. " = " .. tostring(v) .. ": "
                            .. (want_ok and "refused: " or "accepted: ") .. tostring(err)
        end
    end
    for _, o in ipairs(schema) do
        for where in pairs(o.where) do
            if o.min then
                local vals = {}
                if o.default ~= "" and tonumber(o.default) then
                    vals[#vals + 1] = { tonumber(o.default), true }
                end
                vals[#vals + 1] = { o.min, not o.min_open }
                vals[#vals + 1] = { o.max, true }
                local step = o.type == "integer" and 1 or (o.max <= 1 and 0.1 or 1)
                vals[#vals + 1] = { o.min - step, false }
                vals[#vals + 1] = { o.max + step, false }
                if o.type == "integer" then
                    vals[#vals + 1] = { o.min + 0.5, false }
                end
                for _, p in ipairs(vals) do
                    -- large valid values that would take the test long
                    local heavy = where == "connect" and p[2] and p[1] > 64
                                  and (o.name == "streams" or o.name == "conns")
                    if not heavy then
                        try(o, where, p[1], p[2])
                    end
                end
                try(o, where, 0 / 0, false)
            end
            -- another type
            local other = (o.type == "string" or o.type == "list"
                           or o.type == "table") and true or "x"
            if where ~= "method" and o.name ~= "hash_key" then
                try(o, where, other, false)
            end
        end
    end
    return "checked " .. checked .. "\n" .. table.concat(out, "\n")
           .. (#out > 0 and "\n" or "")
end

return _M
