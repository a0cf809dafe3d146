-- resty.ffi.qrpc.gateway.request: the qrpc request of an HTTP request: the
-- message (JSON text) from the path variables, the query string and the
-- body (its Content-Type and max_body checked), and the forwarded headers.

local json = require "resty.ffi.qrpc.json"
local schema = require "resty.ffi.qrpc.gateway.schema"
local routes = require "resty.ffi.qrpc.gateway.routes"
local config = require "resty.ffi.qrpc.gateway.config"

local ngx = ngx
local ngx_var = ngx.var
local ngx_req = ngx.req
local get_headers = ngx_req.get_headers
local get_uri_args = ngx_req.get_uri_args

local type = type
local pairs = pairs
local pcall = pcall
local tostring = tostring
local tonumber = tonumber
local math_huge = math.huge
local str_find = string.find
local str_lower = string.lower
local str_match = string.match
local str_gmatch = string.gmatch
local str_sub = string.sub
local str_byte = string.byte
local ipairs = ipairs
local tab_concat = table.concat
local io_open = io.open
local decode_args = ngx.decode_args

local json_encode = json.encode
local chain = schema.chain
local path_of = schema.path_of
local value_kind = schema.value_kind
local path_value = routes.path_value
local pattern_match = config.pattern_match
local update_mask = require("resty.ffi.qrpc.gateway.mask").update_mask

-- A decoder for request bodies that marks JSON arrays (an empty [] stays a
-- list when encoded again), where lua-cjson offers it.
local ok_cjson, cjson = pcall(require, "cjson.safe")
local body_decode = json.decode
if ok_cjson and cjson.new then
    local c = cjson.new()
    if c.decode_array_with_array_mt then
        c.decode_array_with_array_mt(true)
    end
    if c.decode_max_depth then
        c.decode_max_depth(100)
    end
    body_decode = function(s)
        local v, err = c.decode(s)
        if v == nil then
            return nil, err
        end
        return v
    end
end

local _M = {}

local form_message -- defined below, used by message

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

-- add_args(gw, input, msg, bound, args, label) sets msg's fields (of
-- message type input) from decoded URL arguments (the query string, a
-- form body); bound: the field paths set otherwise, which win
local function add_args(gw, input, msg, bound, args, label)
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

local function read_body(gw)
    local len = tonumber(ngx_var.http_content_length)
    local max = gw.conf.max_body
    if len and len > max then
        return nil, 413
    end
    ngx_req.read_body()
    local data = ngx_req.get_body_data()
    if not data then
        local file = ngx_req.get_body_file()
        if file then
            local f = io_open(file, "rb")
            if f then
                data = f:read("*a")
                f:close()
            end
        end
    end
    data = data or ""
    if #data > max then
        return nil, 413
    end
    return data
end

-- add_query(gw, route, msg, bound, form_get) -> true | nil, status, err;
-- form_get: a form POST served by a GET route (path length fallback), whose
-- body adds to the query string as net/http's ParseForm adds it: the
-- body's values first
local function add_query(gw, route, msg, bound, form_get)
    local args, err = get_uri_args(100)
    if err == "truncated" then
        return nil, 400, "more than 100 query parameters"
    end
    if form_get then
        local data, st = read_body(gw)
        if not data then
            return nil, st, "request body larger than " .. gw.conf.max_body .. " bytes"
        end
        local form, ferr = decode_args(data, 100)
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

local function json_type(ct)
    if not ct then
        return false
    end
    local mime = str_lower(str_match(ct, "^%s*([^;%s]+)") or "")
    return mime == "application/json" or str_find(mime, "^application/[%w.-]+%+json$") ~= nil
end


local function form_type(ct)
    return str_lower(str_match(ct or "", "^%s*([^;%s]+)") or "")
           == "application/x-www-form-urlencoded"
end

-- A form body sets fields as the query string does: of the whole message
-- (body "*"), or of the body's field.
function form_message(gw, route, msg, bound, data)
    local args, err = decode_args(data, 100)
    if err == "truncated" then
        return nil, 400, "more than 100 form fields"
    end
    local target, input = msg, route.input
    local f = route.body_field
    if f then
        if f.kind ~= "message" then
            return nil, 415, "a form body needs a message field as the body ("
                             .. f.name .. " is not one)"
        end
        target = msg[f.name] or {}
        msg[f.name] = target
        input = f.type
        bound[f.name] = true
    end
    local ok, ferr = add_args(gw, input, target, {}, args, "form field")
    if not ok then
        return nil, 400, ferr
    end
    return true
end

-- message(gw, route, segs, n, last, form_get) -> JSON text | nil, status,
-- err: the request message of a matched route (find's segs, n, last;
-- form_get: see add_query)
function _M.message(gw, route, segs, n, last, form_get)
    -- the message: path variables, then the body, then the query string
    local msg, bound, pathvals = {}, {}, {}
    local vars = route.t.vars
    for i = 1, #vars do
        local v = vars[i]
        local s = path_value(v, segs, n, last)
        local f = v.chain[#v.chain]
        local cv, cerr = (v.repeated and conv_list or conv)(value_kind(f), s)
        if cv == nil then
            return nil, 400, "path {" .. v.field .. "}: " .. cerr
        end
        local sok, serr = set(msg, v.chain, cv, "path")
        if not sok then
            return nil, 400, serr
        end
        pathvals[i] = cv
        bound[v.path] = true
    end

    local text, form, mask
    local body_mode = route.body
    if body_mode ~= "" then
        local data, st = read_body(gw)
        if not data then
            return nil, st, "request body larger than " .. gw.conf.max_body .. " bytes"
        end
        local conf = gw.conf
        local ct = ngx_var.content_type
        if data ~= "" and not json_type(ct) then
            if (ct == nil or ct == "") and conf.default_content_type then -- luacheck: ignore 542
                -- read as JSON, as grpc-gateway reads a body without a type
            elseif conf.form_body and form_type(ct) then
                local fok, fst, ferr = form_message(gw, route, msg, bound, data)
                if not fok then
                    return nil, fst, ferr
                end
                data = ""
                form = true
            else
                return nil, 415, "Content-Type must be application/json (got "
                              .. tostring(ct or "none") .. ")"
            end
        end
        if form then -- luacheck: ignore 542
            -- the fields are set
        elseif body_mode == "*" then
            if #vars == 0 then
                text = data ~= "" and data or "{}"
            elseif data ~= "" then
                local b, derr = body_decode(data)
                if b == nil then
                    return nil, 400, "bad JSON body: " .. tostring(derr)
                end
                if type(b) ~= "table" or (#b > 0) then
                    return nil, 400, "bad message: " .. route.input
                                      .. ": the body must be a JSON object"
                end
                for i = 1, #vars do
                    local v = vars[i]
                    local sok, serr = set(b, v.chain, pathvals[i], "path {" .. v.field .. "}")
                    if not sok then
                        return nil, 400, serr
                    end
                end
                msg = b
            end
        else
            local f = route.body_field
            bound[f.name] = true
            if data ~= "" then
                if msg[f.name] == nil then
                    -- not bound by the path: the body is the field's value as sent
                    local b, derr = body_decode(data)
                    if b == nil then
                        return nil, 400, "bad JSON body: " .. tostring(derr)
                    end
                    if route.mask_field and gw.conf.patch_update_mask and type(b) == "table" then
                        mask, derr = update_mask(gw.schema, f.type, b)
                        if not mask then
                            return nil, 400, "bad message: " .. route.input .. ": " .. derr
                        end
                    end
                    msg[f.name] = b
                else
                    local b, derr = body_decode(data)
                    if b == nil then
                        return nil, 400, "bad JSON body: " .. tostring(derr)
                    end
                    if type(b) ~= "table" then
                        return nil, 400, "bad message: " .. route.input .. ": " .. f.name
                                          .. ": the body must be a JSON object"
                    end
                    if route.mask_field and gw.conf.patch_update_mask then
                        -- the fields of the body as sent, before the path's
                        local merr
                        mask, merr = update_mask(gw.schema, f.type, b)
                        if not mask then
                            return nil, 400, "bad message: " .. route.input .. ": " .. merr
                        end
                    end
                    -- the path's fields inside the body's object win
                    for i = 1, #vars do
                        local ch = vars[i].chain
                        if ch[1] == f and #ch > 1 then
                            local sub = {}
                            for j = 2, #ch do
                                sub[j - 1] = ch[j]
                            end
                            local sok, serr = set(b, sub, pathvals[i],
                                                  "path {" .. vars[i].field .. "}")
                            if not sok then
                                return nil, 400, serr
                            end
                        end
                    end
                    msg[f.name] = b
                end
            end
        end
    end
    if body_mode ~= "*" then
        local qok, qst, qerr = add_query(gw, route, msg, bound, form_get)
        if not qok then
            return nil, qst, qerr
        end
        local mf = route.mask_field
        if mask and msg[mf.name] == nil and msg[mf.json] == nil then
            msg[mf.name] = mask
        end
    end
    if not text then
        local eerr
        text, eerr = json_encode(msg)
        if not text then
            return nil, 400, "bad message: " .. route.input .. ": " .. tostring(eerr)
        end
    end
    return text
end

-- The request headers grpc-gateway's default matcher forwards with the
-- "grpcgateway-" prefix (its isPermanentHTTPHeader list).
local PERMANENT = {}
for _, k in ipairs({
    "accept", "accept-charset", "accept-language", "accept-ranges", "authorization",
    "cache-control", "content-type", "cookie", "date", "expect", "from",
    "if-match", "if-modified-since", "if-none-match", "if-schedule-tag-match",
    "if-unmodified-since", "max-forwards", "origin", "pragma", "referer",
    "user-agent", "via", "warning",
}) do
    PERMANENT[k] = "grpcgateway-" .. k
end

-- headers(conf) -> the request headers forward_headers names, and with
-- grpc_metadata the metadata grpc-gateway makes of them (nil: none).
-- ngx.req.get_headers gives the names in lower case already. Host is not
-- among them: Go's HTTP server keeps it out of a request's headers, so
-- grpc-gateway sends it only as x-forwarded-host (when the client sent no
-- X-Forwarded-Host of its own).
function _M.headers(conf)
    local fwd = conf.forward
    local meta = conf.grpc_metadata
    if not fwd and not meta then
        return nil
    end
    local headers
    local h = get_headers(100)
    for k, v in pairs(h) do
        if type(v) == "table" then
            v = tab_concat(v, ", ")
        end
        if fwd and pattern_match(fwd, k) then
            headers = headers or {}
            headers[k] = v
        end
        if meta then
            if #k > 14 and str_byte(k, 1) == 103 -- "g"
               and str_sub(k, 1, 14) == "grpc-metadata-"
            then
                headers = headers or {}
                headers[str_sub(k, 15)] = v
            elseif PERMANENT[k] then
                headers = headers or {}
                headers[PERMANENT[k]] = v
                if k == "authorization" then
                    headers.authorization = v
                end
            end
        end
    end
    if meta then
        headers = headers or {}
        local xfh = h["x-forwarded-host"]
        if type(xfh) == "table" then
            xfh = xfh[1]
        end
        headers["x-forwarded-host"] = xfh or h.host
        local xff = h["x-forwarded-for"]
        if type(xff) == "table" then
            xff = tab_concat(xff, ", ")
        end
        local remote = ngx_var.remote_addr
        headers["x-forwarded-for"] = xff and remote and (xff .. ", " .. remote) or xff or remote
    end
    return headers
end

return _M
