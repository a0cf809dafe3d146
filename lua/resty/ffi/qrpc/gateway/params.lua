-- resty.ffi.qrpc.gateway.params: the fields of a request message that
-- come from URL arguments: path variables, the query string and form
-- bodies, converted as the proto3 JSON mapping reads them.

local schema = require "resty.ffi.qrpc.gateway.schema"
local utf8_valid = require("resty.ffi.qrpc.gateway.utf8").valid

local ngx = ngx
local get_uri_args = ngx.req.get_uri_args
local decode_args = ngx.decode_args

local type = type
local pairs = pairs
local tostring = tostring
local tonumber = tonumber
local math_huge = math.huge
local str_find = string.find
local str_match = string.match
local str_gmatch = string.gmatch
local str_sub = string.sub
local tab_sort = table.sort

local chain = schema.chain
local path_of = schema.path_of
local value_kind = schema.value_kind

local _M = {}

local INT_KINDS = {
    int32 = true, sint32 = true, sfixed32 = true, uint32 = true, fixed32 = true,
    int64 = true, sint64 = true, sfixed64 = true, uint64 = true, fixed64 = true,
}

local function quote(s)
    return "\"" .. tostring(s) .. "\""
end

-- conv(f, s, kind) -> JSON-ready value | nil, err
local function conv(kind, s)
    if s == true then
        if kind == "bool" then
            return true
        end
        s = ""
    end
    if kind == "bool" then
        if s == "true" or s == "1" then
            return true
        elseif s == "false" or s == "0" then
            return false
        end
        return nil, "expected true or false, got " .. quote(s)
    elseif kind == "double" or kind == "float" then
        local n = tonumber(s)
        if n and n == n and n ~= math_huge and n ~= -math_huge then
            return n
        end
        return s     -- "NaN", "Infinity", or Go says what is wrong
    elseif kind == "enum" then
        if str_find(s, "^%-?%d+$") then
            return tonumber(s)
        end
        return s
    elseif INT_KINDS[kind] then
        if s == "" then
            return nil, "expected an integer, got \"\""
        end
        return s     -- a numeric string: Go checks it and its range
    end
    return s
end

-- conv_list(kind, s): a repeated field's path segment, its values joined
-- with "," (as grpc-gateway splits it)
local function conv_list(kind, s)
    local list = {}
    for item in str_gmatch(s .. ",", "([^,]*),") do
        local cv, err = conv(kind, item)
        if cv == nil then
            return nil, err
        end
        list[#list + 1] = cv
    end
    return list
end

-- fits(f, v): can v, a decoded JSON value, be scalar field f's value?
-- Its JSON kind only (and UTF-8 for a string): what protojson refuses of
-- a value that a path variable then replaces, which Go never sees.
local function fits(f, v)
    local tv, k = type(v), f.kind
    if f.repeated or f.map then
        return true   -- set by the query string, a list: Go reads it
    elseif k == "string" then
        return tv == "string" and utf8_valid(v)
    elseif k == "bytes" then
        return tv == "string"
    elseif k == "bool" then
        return tv == "boolean"
    elseif k == "message" then
        return true   -- a well-known type's own forms: Go reads them
    end
    return tv == "number" or tv == "string"   -- numbers and enums
end

-- the body may already hold under either field name
local function set(t, ch, v, from, qkey, label)
    for i = 1, #ch - 1 do
        local f = ch[i]
        local k = f.name
        local sub = t[k]
        if sub == nil and t[f.json] ~= nil then
            k = f.json
            sub = t[k]
        end
        if sub == nil or sub == ngx.null then
            sub = {}
            t[k] = sub
        elseif type(sub) ~= "table" then
            if qkey then
                -- a query parameter: its name is quoted only on this error
                from = (label or "query parameter") .. " " .. quote(qkey)
            end
            return nil, from .. ": " .. f.name .. " is not an object in the body"
        end
        t = sub
    end
    local f = ch[#ch]
    local old = t[f.name]
    if old == nil then
        old = t[f.json]
    end
    -- from: a path variable over a body (a query parameter or a form
    -- field, from == nil, finds only values of ours)
    if from and old ~= nil and old ~= ngx.null and not fits(f, old) then
        return nil, from .. ": the body's " .. f.name .. " is not a " .. f.kind .. " value"
    end
    if f.json ~= f.name and t[f.json] ~= nil then
        t[f.json] = nil
    end
    t[f.name] = v
    return true
end

-- The field chain of a query parameter's name in message input, with its
-- dotted path (ch.path), looked up once per gateway and name: a request
-- repeats the names of the last. Misses are kept too (false, err), up to
-- MAX_CHAINS names per message, so that made-up names cannot grow it.
local MAX_CHAINS = 256

local function query_chain(gw, input, name)
    local cache = gw.chains[input]
    if not cache then
        cache = { n = 0 }
        gw.chains[input] = cache
    end
    local hit = cache[name]
    if hit ~= nil then
        return hit, cache[name .. "\0err"]
    end
    local ch, cerr = chain(gw.schema, input, name)
    if cache.n < MAX_CHAINS then
        cache.n = cache.n + 1
        if ch then
            ch.path = path_of(ch)
            cache[name] = ch
        else
            cache[name] = false
            cache[name .. "\0err"] = cerr
        end
    elseif ch then
        ch.path = path_of(ch)
    end
    return ch, cerr
end

-- add_args(gw, input, msg, bound, args, label, seen) sets msg's fields (of
-- message type input) from decoded URL arguments (the query string, a
-- form body); bound: the field paths set otherwise, which win; seen (if
-- given) gets the path of every field an argument names
local function add_args(gw, input, msg, bound, args, label, seen)
    local function query_err(k)
        return label .. " " .. quote(k)
    end
    for k, v in pairs(args) do
        local name, mkey = k, nil
        if str_find(k, "[", 1, true) then
            local n2, m2 = str_match(k, "^([^%[]+)%[(.*)%]$")
            if n2 then
                name, mkey = n2, m2
            end
        end
        local ch, cerr = query_chain(gw, input, name)
        if ch and seen then
            seen[ch.path] = true
        end
        if not ch then
            if not gw.conf.discard_unknown then
                return nil, query_err(k) .. ": " .. cerr
            end
        elseif bound[ch[1].name] or bound[ch.path] then -- luacheck: ignore 542
            -- set by the path or the body: they win
        else
            local f = ch[#ch]
            local kind = value_kind(f)
            local where = k
            if mkey then
                if not f.map then
                    return nil, query_err(where) .. ": " .. f.name .. " is not a map"
                end
                if type(v) == "table" then
                    return nil, query_err(where) .. ": given " .. #v .. " times"
                end
                if not kind then
                    return nil, query_err(where) .. ": map values of type "
                                .. tostring(f.type) .. " cannot come from the query string"
                end
                local cv, e = conv(kind, v)
                if cv == nil then
                    return nil, query_err(where) .. ": " .. e
                end
                -- the map's table, then the key
                local mapv = {}
                local parent = msg
                for i = 1, #ch - 1 do
                    local pf = ch[i]
                    parent[pf.name] = parent[pf.name] or {}
                    parent = parent[pf.name]
                end
                mapv = parent[f.name] or mapv
                mapv[mkey] = cv
                parent[f.name] = mapv
            elseif f.map or not kind then
                return nil, query_err(where) .. ": " .. f.name .. " is a "
                            .. (f.map and "map: use " .. f.name .. "[key]=value"
                                or "message: give its fields as " .. name .. ".<field>")
            elseif f.repeated then
                local list = {}
                if type(v) ~= "table" then
                    v = { v }
                end
                for i = 1, #v do
                    local cv, e = conv(kind, v[i])
                    if cv == nil then
                        return nil, query_err(where) .. ": " .. e
                    end
                    list[i] = cv
                end
                local ok, serr = set(msg, ch, list, nil, where, label)
                if not ok then
                    return nil, serr
                end
            else
                if type(v) == "table" then
                    return nil, query_err(where) .. ": given " .. #v
                                .. " times for a single field"
                end
                local cv, e = conv(kind, v)
                if cv == nil then
                    return nil, query_err(where) .. ": " .. e
                end
                local ok, serr = set(msg, ch, cv, nil, where, label)
                if not ok then
                    return nil, serr
                end
            end
        end
    end
    return true
end

-- add_query(gw, route, msg, bound, form) -> true | nil, status, err;
-- form: the body of a form request whose route takes no body (the form
-- POST served by a GET route, grpc-gateway's path length fallback; a form
-- POST, PUT or PATCH of a route without body), whose fields add to the
-- query string's as net/http's ParseForm adds them: the body's values
-- first
function _M.add_query(gw, route, msg, bound, form)
    local args, err = get_uri_args(100)
    if err == "truncated" then
        return nil, 400, "more than 100 query parameters"
    end
    if form then
        local ferr
        form, ferr = decode_args(form, 100)
        if ferr == "truncated" then
            return nil, 400, "more than 100 form fields"
        end
        for k, v in pairs(args) do
            local fv = form[k]
            if fv == nil then
                form[k] = v
            else
                local list = type(fv) == "table" and fv or { fv }
                if type(v) ~= "table" then
                    v = { v }
                end
                for i = 1, #v do
                    list[#list + 1] = v[i]
                end
                form[k] = list
            end
        end
        args = form
    end
    local ok, aerr = add_args(gw, route.input, msg, bound, args, "query parameter")
    if not ok then
        return nil, 400, aerr
    end
    return true
end
-- form_message(gw, route, msg, bound, data, want_paths) -> true, paths |
-- nil, status, err: a form body sets fields as the query string does, of
-- the whole message (body "*") or of the body's field (a message field);
-- a field the path sets keeps the path's value, as with a JSON body.
-- want_paths: paths is the sorted list of the fields the form names, by
-- their .proto names, for the update_mask of a PATCH
function _M.form_message(gw, route, msg, bound, data, want_paths)
    local args, err = decode_args(data, 100)
    if err == "truncated" then
        return nil, 400, "more than 100 form fields"
    end
    local target, input, fbound = msg, route.input, bound
    local f = route.body_field
    if f then
        target = msg[f.name] or {}
        msg[f.name] = target
        input = f.type
        -- the path's fields inside the body's field, by their paths there
        fbound = {}
        local pre = f.name .. "."
        for p in pairs(bound) do
            if str_sub(p, 1, #pre) == pre then
                fbound[str_sub(p, #pre + 1)] = true
            end
        end
        bound[f.name] = true
    end
    local seen = want_paths and {} or nil
    local ok, ferr = add_args(gw, input, target, fbound, args, "form field", seen)
    if not ok then
        return nil, 400, ferr
    end
    if not seen then
        return true
    end
    local paths = {}
    for p in pairs(seen) do
        paths[#paths + 1] = p
    end
    tab_sort(paths)
    return true, paths
end

_M.conv = conv
_M.conv_list = conv_list
_M.set = set

return _M
