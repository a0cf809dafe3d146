-- resty.ffi.qrpc.gateway: a REST/JSON gateway in front of qrpc services,
-- built from the google.api.http options of .proto files (and routes
-- given by hand). See docs/gateway.md.
--
--   local gw, err = gateway.new{ upstream = ..., opts = ..., protos = {...}, ... }
--   gw:serve()          -- content_by_lua, under one location
--   gw:openapi()        -- the OpenAPI 3.1 document, as a Lua table
--
-- Go describes each .proto file once per worker (QRPC_OP_PROTO_DESCRIBE:
-- services, HTTP rules, messages); route matching, the request message
-- (JSON text in the proto3 JSON mapping) and the answer are Lua's. Calls go
-- through qrpc.connect, so pools, retries, hedging and metrics apply.

local qrpc = require "resty.ffi.qrpc"
local proto = require "resty.ffi.qrpc.proto"
local json = require "resty.ffi.qrpc.json"
local metrics = require "resty.ffi.qrpc.metrics"
local ffi = require "ffi"

local ngx = ngx
local ngx_var = ngx.var
local ngx_req = ngx.req
local ngx_header = ngx.header
local ngx_print = ngx.print
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local ngx_WARN = ngx.WARN
local get_phase = ngx.get_phase
local get_headers = ngx_req.get_headers
local get_uri_args = ngx_req.get_uri_args
local get_method = ngx_req.get_method

local type = type
local pairs = pairs
local ipairs = ipairs
local pcall = pcall
local tostring = tostring
local tonumber = tonumber
local setmetatable = setmetatable
local getmetatable = getmetatable
local math_huge = math.huge
local math_floor = math.floor
local str_byte = string.byte
local str_char = string.char
local str_find = string.find
local str_sub = string.sub
local str_gsub = string.gsub
local str_lower = string.lower
local str_match = string.match
local tab_concat = table.concat
local tab_sort = table.sort
local io_open = io.open

local json_encode = json.encode
local empty_array = json.empty_array

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

local _M = { _VERSION = "0.1.0" }
local mt = { __index = _M }

local STAR, DSTAR = 1, 2

-- gRPC's code -> HTTP status table (codes = "grpc"), as grpc-gateway and
-- Envoy's transcoder use it.
local GRPC_CODES = {
    [0] = 200, [1] = 499, [2] = 500, [3] = 400, [4] = 504, [5] = 404,
    [6] = 409, [7] = 403, [8] = 429, [9] = 400, [10] = 409, [11] = 400,
    [12] = 501, [13] = 500, [14] = 503, [15] = 500, [16] = 401,
}

-- The gRPC code in the error body of the gateway's own answers.
local STATUS_CODE = {
    [400] = 3, [404] = 5, [405] = 12, [406] = 3, [413] = 8, [415] = 3,
    [500] = 13, [502] = 14, [503] = 14, [504] = 4,
}

-- Well-known message types whose JSON form is one scalar: how a path or
-- query value converts.
local WKT_SCALAR = {
    ["google.protobuf.Timestamp"] = "string",
    ["google.protobuf.Duration"] = "string",
    ["google.protobuf.FieldMask"] = "string",
    ["google.protobuf.StringValue"] = "string",
    ["google.protobuf.BytesValue"] = "bytes",
    ["google.protobuf.BoolValue"] = "bool",
    ["google.protobuf.DoubleValue"] = "double",
    ["google.protobuf.FloatValue"] = "float",
    ["google.protobuf.Int32Value"] = "int32",
    ["google.protobuf.UInt32Value"] = "uint32",
    ["google.protobuf.Int64Value"] = "int64",
    ["google.protobuf.UInt64Value"] = "uint64",
}

local OPTIONS = {
    upstream = true, opts = true, protos = true, prefix = true, routes = true,
    codes = true, max_body = true, method_name = true, discard_unknown = true,
    forward_headers = true, response_headers = true, openapi = true,
    retry_after = true, proto_names = true,
}

local function bad(what)
    return nil, "bad argument #1: " .. what
end


-------------------------------------------------------------------------
-- Path templates (google/api/http.proto)
-------------------------------------------------------------------------

-- Splits s on "/" outside braces.
local function split_top(s)
    local out, depth, start = {}, 0, 1
    for i = 1, #s do
        local c = str_byte(s, i)
        if c == 123 then       -- {
            depth = depth + 1
        elseif c == 125 then   -- }
            depth = depth - 1
        elseif c == 47 and depth == 0 then
            out[#out + 1] = str_sub(s, start, i - 1)
            start = i + 1
        end
    end
    out[#out + 1] = str_sub(s, start)
    return out
end

local function check_literal(s)
    return s ~= "" and not str_find(s, "[{}*/:?#%s]")
end

-- parse_template(tpl) -> { pattern, vars, verb, dstar, key } | nil, err
-- pattern: literals (strings), STAR, DSTAR; vars: { field = "a.b",
-- first = i, last = j } (last = -1: to the end, through a **).
local function parse_template(tpl)
    if type(tpl) ~= "string" or str_sub(tpl, 1, 1) ~= "/" then
        return nil, "must start with /"
    end
    local body = str_sub(tpl, 2)
    local verb
    local segs = split_top(body)
    -- the verb: ":name" after the last segment, outside braces
    local last = segs[#segs]
    local depth, colon = 0, nil
    for i = 1, #last do
        local c = str_byte(last, i)
        if c == 123 then
            depth = depth + 1
        elseif c == 125 then
            depth = depth - 1
        elseif c == 58 and depth == 0 then
            colon = i
        end
    end
    if colon then
        verb = str_sub(last, colon + 1)
        if not check_literal(verb) then
            return nil, "bad verb \"" .. verb .. "\""
        end
        segs[#segs] = str_sub(last, 1, colon - 1)
    end
    local pattern, vars, seen = {}, {}, {}
    local function add(seg)
        if seg == "*" then
            pattern[#pattern + 1] = STAR
        elseif seg == "**" then
            pattern[#pattern + 1] = DSTAR
        elseif check_literal(seg) then
            pattern[#pattern + 1] = seg
        else
            return nil, "bad segment \"" .. seg .. "\""
        end
        return true
    end
    for _, seg in ipairs(segs) do
        if str_byte(seg, 1) == 123 then
            local inner = str_match(seg, "^{(.*)}$")
            if not inner then
                return nil, "bad variable \"" .. seg .. "\""
            end
            local field, sub = str_match(inner, "^([^=]*)=(.*)$")
            if not field then
                field, sub = inner, "*"
            end
            if not str_find(field, "^[%a_][%w_]*$")
               and not str_find(field, "^[%a_][%w_]*%.[%w_.]*[%w_]$")
               or str_find(field, "..", 1, true)
            then
                return nil, "bad field path \"" .. field .. "\""
            end
            if seen[field] then
                return nil, "variable " .. field .. " twice"
            end
            seen[field] = true
            if sub == "" or str_find(sub, "[{}]") then
                return nil, "bad variable \"" .. seg .. "\""
            end
            local first = #pattern + 1
            for _, s in ipairs(split_top(sub)) do
                local ok, err = add(s)
                if not ok then
                    return nil, err
                end
            end
            vars[#vars + 1] = { field = field, first = first, last = #pattern }
        else
            local ok, err = add(seg)
            if not ok then
                return nil, err
            end
        end
    end
    local dstar
    for i, p in ipairs(pattern) do
        if p == DSTAR then
            if i ~= #pattern then
                return nil, "** must be the last segment"
            end
            dstar = i
        end
    end
    for _, v in ipairs(vars) do
        if dstar and v.last == dstar then
            v.last = -1
        end
    end
    -- specificity: per segment, a literal before * before **; then a verb
    local key = { verb and "1" or "0" }
    for i, p in ipairs(pattern) do
        key[i + 1] = p == DSTAR and "a" or p == STAR and "b" or "c"
    end
    return { pattern = pattern, vars = vars, verb = verb,
             verb_suffix = verb and (":" .. verb), dstar = dstar,
             key = tab_concat(key), n = #pattern }
end
_M._parse_template = parse_template


-- percent-decoding of a path segment; keep_slash: %2F stays encoded (a
-- variable spanning several segments)
local function unhex(h)
    return str_char(tonumber(h, 16))
end
local function unhex_keep_slash(h)
    if h == "2F" or h == "2f" then
        return "%" .. h
    end
    return str_char(tonumber(h, 16))
end
local function decode_seg(s, keep_slash)
    if not str_find(s, "%", 1, true) then
        return s
    end
    return (str_gsub(s, "%%(%x%x)", keep_slash and unhex_keep_slash or unhex))
end


-- match(t, segs, n) -> true, last (the last segment without the verb)
local function match(t, segs, n)
    local last = segs[n]
    if t.verb_suffix then
        local suf = t.verb_suffix
        if #last <= #suf and not (#last == #suf and t.dstar) then
            return false
        end
        if str_sub(last, -#suf) ~= suf then
            return false
        end
        last = str_sub(last, 1, -#suf - 1)
    end
    local pat, np = t.pattern, t.n
    if t.dstar then
        if n < np - 1 then
            return false
        end
    elseif n ~= np then
        return false
    end
    for i = 1, np do
        local p = pat[i]
        if p == DSTAR then
            break
        end
        local s = i == n and last or segs[i]
        if p == STAR then
            if s == "" then
                return false
            end
        elseif p ~= s then
            return false
        end
    end
    return true, last
end


-------------------------------------------------------------------------
-- Schema
-------------------------------------------------------------------------

-- index(schema): fields by proto and JSON name
local function index(schema)
    for _, m in pairs(schema.messages) do
        m.by_name = {}
        m.by_json = {}
        for _, f in ipairs(m.fields) do
            m.by_name[f.name] = f
            m.by_json[f.json] = f
        end
    end
end

local function field_of(schema, msg, name)
    local m = schema.messages[msg]
    if not m or not m.by_name then
        return nil
    end
    return m.by_name[name] or m.by_json[name]
end

-- chain(schema, msg, "a.b") -> { field_a, field_b } | nil, err
local function chain(schema, msg, path)
    local out = {}
    local cur = msg
    local start = 1
    while true do
        local dot = str_find(path, ".", start, true)
        local name = str_sub(path, start, dot and dot - 1 or #path)
        local f = field_of(schema, cur, name)
        if not f then
            return nil, "no field " .. name .. " in " .. cur
        end
        out[#out + 1] = f
        if not dot then
            return out
        end
        if f.kind ~= "message" or f.repeated or f.map or WKT_SCALAR[f.type] then
            return nil, name .. " is not a message field"
        end
        cur = f.type
        start = dot + 1
    end
end


-- "a.b" of a chain of fields, by their proto names
local function path_of(ch)
    if #ch == 1 then
        return ch[1].name
    end
    local names = {}
    for i = 1, #ch do
        names[i] = ch[i].name
    end
    return tab_concat(names, ".")
end


-------------------------------------------------------------------------
-- Configuration
-------------------------------------------------------------------------

local function string_list(v, what, allow_pattern)
    if type(v) ~= "table" then
        return bad(what .. " must be a list of strings")
    end
    local out = {}
    for i = 1, #v do
        local s = v[i]
        if type(s) ~= "string" or s == "" then
            return bad(what .. "[" .. i .. "] must be a non-empty string")
        end
        if allow_pattern then
            s = str_lower(s)
            if str_find(s, "*", 1, true) and not str_find(s, "^[^*]*%*$") then
                return bad(what .. "[" .. i .. "]: a pattern is a name or a prefix "
                           .. "followed by one * (got \"" .. s .. "\")")
            end
        end
        out[i] = s
    end
    for k in pairs(v) do
        if type(k) ~= "number" or k < 1 or k > #v or k ~= math_floor(k) then
            return bad(what .. " must be a list of strings")
        end
    end
    return out
end

-- header name patterns: { exact = { name = true }, prefixes = { "x-" } }
local function patterns(list)
    local p = { exact = {}, prefixes = {} }
    for _, s in ipairs(list) do
        if str_sub(s, -1) == "*" then
            p.prefixes[#p.prefixes + 1] = str_sub(s, 1, -2)
        else
            p.exact[s] = true
        end
    end
    return p
end

local function pattern_match(p, name)
    if p.exact[name] then
        return true
    end
    for _, pre in ipairs(p.prefixes) do
        if str_sub(name, 1, #pre) == pre then
            return true
        end
    end
    return false
end

-- hand route "VERB /path" -> verb, tpl
local function route_key(k)
    if type(k) ~= "string" then
        return nil
    end
    local verb, tpl = str_match(k, "^(%u+)%s+(/%S*)$")
    return verb, tpl
end

local function check_conf(c)
    if type(c) ~= "table" then
        return bad("options must be a table (got " .. type(c) .. ")")
    end
    for k in pairs(c) do
        if not OPTIONS[k] then
            return bad("unknown option '" .. tostring(k) .. "'")
        end
    end
    local conf = {}
    local up = c.upstream
    if type(up) == "string" then
        if up == "" then
            return bad("upstream must be host:port or a list of them")
        end
    elseif type(up) == "table" then
        local l, err = string_list(up, "upstream")
        if not l then
            return nil, err
        end
        if #l == 0 then
            return bad("upstream must not be empty")
        end
        up = l
    else
        return bad("upstream must be host:port or a list of them (got " .. type(up) .. ")")
    end
    conf.upstream = up
    if c.opts ~= nil and type(c.opts) ~= "table" then
        return bad("opts must be a table of qrpc.connect options (got " .. type(c.opts) .. ")")
    end
    conf.opts = c.opts or {}

    local p = c.protos
    if type(p) ~= "table" then
        return bad("protos must be a table { files = { ... }, import_paths = { ... } }")
    end
    for k in pairs(p) do
        if k ~= "files" and k ~= "import_paths" then
            return bad("protos: unknown option '" .. tostring(k) .. "'")
        end
    end
    local files, err = string_list(p.files or {}, "protos.files")
    if not files then
        return nil, err
    end
    if #files == 0 then
        return bad("protos.files must list at least one .proto file")
    end
    local ips
    ips, err = string_list(p.import_paths or {}, "protos.import_paths")
    if not ips then
        return nil, err
    end
    conf.files = files
    conf.import_paths = {}
    for i, d in ipairs(ips) do
        conf.import_paths[i] = proto.absolute(d)
    end

    local prefix = c.prefix or ""
    if type(prefix) ~= "string" or (prefix ~= "" and (str_sub(prefix, 1, 1) ~= "/"
       or str_sub(prefix, -1) == "/" or str_find(prefix, "[%s?#{}*]")))
    then
        return bad("prefix must be \"\" or a path like \"/api\" (no trailing /)")
    end
    conf.prefix = prefix

    local mn = c.method_name or "short"
    if mn ~= "short" and mn ~= "full" then
        return bad("method_name must be \"short\" or \"full\" (got " .. tostring(mn) .. ")")
    end
    conf.method_name = mn

    local mb = c.max_body
    if mb == nil then
        mb = 1048576
    end
    if type(mb) ~= "number" or mb < 0 or mb ~= math_floor(mb) or mb > 2147483647 then
        return bad("max_body must be an integer 0..2147483647 (bytes)")
    end
    conf.max_body = mb

    local ra = c.retry_after
    if ra == nil then
        ra = 1
    end
    if type(ra) ~= "number" or ra < 0 or ra ~= math_floor(ra) or ra > 86400 then
        return bad("retry_after must be an integer 0..86400 (seconds)")
    end
    conf.retry_after = ra

    for _, k in ipairs({ "discard_unknown", "proto_names" }) do
        if c[k] ~= nil and type(c[k]) ~= "boolean" then
            return bad(k .. " must be a boolean")
        end
        conf[k] = c[k] == true
    end

    local oa = c.openapi
    if oa ~= nil and type(oa) ~= "boolean" and type(oa) ~= "table" then
        return bad("openapi must be a boolean or a table { title = ..., version = ... }")
    end
    if type(oa) == "table" then
        for k, v in pairs(oa) do
            if (k ~= "title" and k ~= "version" and k ~= "description") or type(v) ~= "string" then
                return bad("openapi: unknown option '" .. tostring(k)
                           .. "' (title, version, description: strings)")
            end
        end
    end
    conf.openapi = oa and true or false
    conf.openapi_info = type(oa) == "table" and oa or {}

    local codes = c.codes
    local map = {}
    if codes == "grpc" then
        for k, v in pairs(GRPC_CODES) do
            map[k] = v
        end
    elseif type(codes) == "table" then
        for k, v in pairs(codes) do
            if type(k) ~= "number" or k ~= math_floor(k) or k < 0 or k > 4294967295 then
                return bad("codes keys must be qrpc codes (integers >= 0)")
            end
            if type(v) ~= "number" or v ~= math_floor(v) or v < 200 or v > 599 then
                return bad("codes[" .. k .. "] must be an HTTP status 200..599")
            end
            map[k] = v
        end
    elseif codes ~= nil then
        return bad("codes must be a table { [qrpc code] = HTTP status } or \"grpc\"")
    end
    conf.codes = map

    local fwd
    fwd, err = string_list(c.forward_headers or {}, "forward_headers", true)
    if not fwd then
        return nil, err
    end
    conf.forward = #fwd > 0 and patterns(fwd) or nil
    local rh
    rh, err = string_list(c.response_headers or {}, "response_headers", true)
    if not rh then
        return nil, err
    end
    conf.response_headers = #rh > 0 and patterns(rh) or nil

    -- routes by hand: checked here, bound to methods in the worker
    local hand = {}
    if c.routes ~= nil then
        if type(c.routes) ~= "table" then
            return bad("routes must be a table { [\"VERB /path\"] = \"pkg.Service.Method\" }")
        end
        for k, v in pairs(c.routes) do
            local verb, tpl = route_key(k)
            if not verb then
                return bad("routes: key " .. tostring(k) .. " must be \"VERB /path/{field}\"")
            end
            local t, terr = parse_template(tpl)
            if not t then
                return bad("routes[\"" .. k .. "\"]: path " .. terr)
            end
            local r = { verb = verb, tpl = tpl, t = t, hand = true }
            if type(v) == "string" then
                r.method = v
            elseif type(v) == "table" then
                for kk in pairs(v) do
                    if kk ~= "method" and kk ~= "body" and kk ~= "response_body" then
                        return bad("routes[\"" .. k .. "\"]: unknown option '"
                                   .. tostring(kk) .. "'")
                    end
                end
                r.method, r.body, r.response_body = v.method, v.body, v.response_body
            end
            if type(r.method) ~= "string" or not str_find(r.method, "^[%w_.]+[./][%w_]+$") then
                return bad("routes[\"" .. k .. "\"]: method must be \"pkg.Service.Method\"")
            end
            r.method = str_gsub(r.method, "/", ".")
            if r.body ~= nil and type(r.body) ~= "string" then
                return bad("routes[\"" .. k .. "\"]: body must be \"*\", a field name or \"\"")
            end
            if r.body == nil then
                r.body = (verb == "GET" or verb == "DELETE" or verb == "HEAD") and "" or "*"
            end
            if r.response_body ~= nil and type(r.response_body) ~= "string" then
                return bad("routes[\"" .. k .. "\"]: response_body must be a field name")
            end
            r.response_body = r.response_body or ""
            hand[#hand + 1] = r
        end
        tab_sort(hand, function(a, b)
            return a.verb .. " " .. a.tpl < b.verb .. " " .. b.tpl
        end)
    end
    conf.hand = hand
    return conf
end


-------------------------------------------------------------------------
-- Building the routes (in a worker)
-------------------------------------------------------------------------

local function bind_route(gw, r, m)
    local schema = gw.schema
    local label = r.verb .. " " .. gw.conf.prefix .. r.tpl
    local t = r.t
    if not t then
        local err
        t, err = parse_template(r.tpl)
        if not t then
            return nil, label .. ": path " .. err
        end
    end
    local route = {
        verb = r.verb, tpl = r.tpl, t = t, label = label,
        template = gw.conf.prefix .. r.tpl,
        full = m.full, service = m.service, name = m.name, comment = m.comment,
        input = m.input, output = m.output,
        method = gw.conf.method_name == "full" and (m.service .. "/" .. m.name) or m.name,
        body = r.body or "", response_body = r.response_body or "",
        hand = r.hand,
    }
    for _, v in ipairs(t.vars) do
        local ch, err = chain(schema, m.input, v.field)
        if not ch then
            return nil, label .. ": {" .. v.field .. "}: " .. err
        end
        local leaf = ch[#ch]
        if leaf.repeated or leaf.map or (leaf.kind == "message" and not WKT_SCALAR[leaf.type]) then
            return nil, label .. ": {" .. v.field .. "} must name a scalar field"
        end
        v.chain = ch
        v.path = path_of(ch)
    end
    if route.body ~= "" and route.body ~= "*" then
        local f = field_of(schema, m.input, route.body)
        if not f then
            return nil, label .. ": body: no field " .. route.body .. " in " .. m.input
        end
        route.body_field = f
    end
    if route.response_body ~= "" then
        local f = field_of(schema, m.output, route.response_body)
        if not f then
            return nil, label .. ": response_body: no field " .. route.response_body
                        .. " in " .. m.output
        end
        route.resp_field = f
    end
    return route
end

local function build(gw)
    local conf = gw.conf
    local schema = { services = {}, messages = {}, enums = {} }
    local methods = {}  -- "pkg.Svc.Method" -> method
    for _, file in ipairs(conf.files) do
        local text, err = proto.describe(file, conf.import_paths)
        if not text then
            return nil, err
        end
        local s
        s, err = json.decode(text)
        if not s then
            return nil, "describe " .. file .. ": " .. tostring(err)
        end
        for name, m in pairs(s.messages) do
            schema.messages[name] = m
        end
        for name, e in pairs(s.enums) do
            schema.enums[name] = e
        end
        for _, svc in ipairs(s.services) do
            schema.services[#schema.services + 1] = svc
            for _, m in ipairs(svc.methods) do
                m.service = svc.name
                m.full = svc.name .. "." .. m.name
                m.comment = m.comment or ""
                methods[m.full] = m
            end
        end
    end
    index(schema)
    gw.schema = schema
    gw.chains = {} -- query parameter names -> field chains (query_chain)

    local routes, seen = {}, {}
    local function add(r, m)
        local route, err = bind_route(gw, r, m)
        if not route then
            return nil, err
        end
        local k = route.verb .. " " .. route.t.key .. " " .. str_gsub(r.tpl, "{[^}]*}", "{}")
        local prev = seen[k]
        if prev then
            if prev.hand and not route.hand then
                return true
            end
            if not (route.hand and not prev.hand) then
                return nil, route.label .. " is bound twice (" .. prev.full .. ", "
                            .. route.full .. ")"
            end
            for i, x in ipairs(routes) do
                if x == prev then
                    table.remove(routes, i)
                    break
                end
            end
        end
        seen[k] = route
        routes[#routes + 1] = route
        return true
    end
    for _, r in ipairs(conf.hand) do
        local m = methods[r.method]
        if not m then
            return nil, "routes[\"" .. r.verb .. " " .. r.tpl .. "\"]: no method "
                        .. r.method .. " in " .. tab_concat(conf.files, ", ")
        end
        local ok, err = add(r, m)
        if not ok then
            return nil, err
        end
    end
    for _, svc in ipairs(schema.services) do
        for _, m in ipairs(svc.methods) do
            if not m.stream then
                for _, h in ipairs(m.http or {}) do
                    local ok, err = add({ verb = h.method, tpl = h.path, body = h.body,
                                          response_body = h.response_body }, m)
                    if not ok then
                        return nil, err
                    end
                end
            end
        end
    end
    -- most specific first; then in declaration order
    for i, r in ipairs(routes) do
        r.order = i
    end
    tab_sort(routes, function(a, b)
        if a.t.key ~= b.t.key then
            return a.t.key > b.t.key
        end
        return a.order < b.order
    end)
    -- candidates by first segment: routes whose first element is that
    -- literal, with those that start with a wildcard, in order
    local by_first, wild = {}, {}
    for _, r in ipairs(routes) do
        local p = r.t.pattern[1]
        if type(p) ~= "string" then
            wild[#wild + 1] = r
        end
    end
    for _, r in ipairs(routes) do
        local p = r.t.pattern[1]
        if type(p) == "string" and not by_first[p] then
            local list = {}
            for _, x in ipairs(routes) do
                if x.t.pattern[1] == p or type(x.t.pattern[1]) ~= "string" then
                    list[#list + 1] = x
                end
            end
            by_first[p] = list
        end
    end
    gw.routes = routes
    gw.by_first = by_first
    gw.wild = wild
    gw.built = true
    return true
end

local function ensure(gw)
    if gw.built then
        return true
    end
    local ok, err = build(gw)
    if not ok then
        gw.build_err = err
        if not gw.logged then
            gw.logged = true
            ngx_log(ngx_ERR, "qrpc gateway: ", err)
        end
        return nil, err
    end
    return true
end


function _M.new(c)
    local ok, conf, err = pcall(check_conf, c)
    if not ok then
        return bad("options raised an error: " .. tostring(conf))
    end
    if not conf then
        return nil, err
    end
    for _, f in ipairs(conf.files) do
        local lok, lerr = proto.load(f, #conf.import_paths > 0
                                        and { import_paths = conf.import_paths } or nil)
        if not lok then
            return nil, lerr
        end
    end
    local gw = setmetatable({ conf = conf }, mt)
    if get_phase() ~= "init" then
        -- in a worker: the schema at once, so that its errors come back here
        local bok, berr = build(gw)
        if not bok then
            return nil, berr
        end
    end
    return gw
end


-------------------------------------------------------------------------
-- Answers
-------------------------------------------------------------------------

local function write_error(status, code, msg, extra)
    ngx.status = status
    ngx_header["Content-Type"] = "application/json"
    if extra then
        for k, v in pairs(extra) do
            ngx_header[k] = v
        end
    end
    ngx_print('{"code":', code, ',"message":', json_encode(msg), ',"details":[]}\n')
    return status
end

local function fail(status, msg, extra)
    return write_error(status, STATUS_CODE[status] or 2, msg, extra)
end

-- is s valid UTF-8 text (no NUL)?
local function is_text(s)
    if str_find(s, "%z") then
        return false
    end
    if not str_find(s, "[\128-\255]") then
        return true
    end
    local i, n = 1, #s
    while i <= n do
        local c = str_byte(s, i)
        local k
        if c < 0x80 then
            k = 0
        elseif c >= 0xC2 and c <= 0xDF then
            k = 1
        elseif c >= 0xE0 and c <= 0xEF then
            k = 2
        elseif c >= 0xF0 and c <= 0xF4 then
            k = 3
        else
            return false
        end
        for j = i + 1, i + k do
            local d = str_byte(s, j)
            if not d or d < 0x80 or d > 0xBF then
                return false
            end
        end
        i = i + k + 1
    end
    return true
end


-------------------------------------------------------------------------
-- Requests
-------------------------------------------------------------------------

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

local function value_kind(f)
    if f.kind == "message" then
        return WKT_SCALAR[f.type]
    end
    return f.kind
end

-- set(t, ch, v): t[ch[1].name]...[ch[n].name] = v, through tables that
-- the body may already hold under either field name
local function set(t, ch, v, from, qkey)
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
                from = "query parameter " .. quote(qkey)
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

-- add_query(gw, route, msg, bound) adds the query parameters to msg;
-- bound: the field paths the path sets, and the body's field
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

-- the start of a query parameter's error
local function query_err(k)
    return "query parameter " .. quote(k)
end

local function add_query(gw, route, msg, bound)
    local args, err = get_uri_args(100)
    if err == "truncated" then
        return nil, "more than 100 query parameters"
    end
    for k, v in pairs(args) do
        local name, mkey = k, nil
        if str_find(k, "[", 1, true) then
            local n2, m2 = str_match(k, "^([^%[]+)%[(.*)%]$")
            if n2 then
                name, mkey = n2, m2
            end
        end
        local ch, cerr = query_chain(gw, route.input, name)
        if not ch then
            if not gw.conf.discard_unknown then
                return nil, "query parameter " .. quote(k) .. ": " .. cerr
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
                local ok, serr = set(msg, ch, list, nil, where)
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
                local ok, serr = set(msg, ch, cv, nil, where)
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

local function json_type(ct)
    if not ct then
        return false
    end
    local mime = str_lower(str_match(ct, "^%s*([^;%s]+)") or "")
    return mime == "application/json" or str_find(mime, "^application/[%w.-]+%+json$") ~= nil
end

-- match a request: route, vars | nil, status, allow
local function find(gw, method, path)
    local segs, n = {}, 0
    local i = 2
    while true do
        local j = str_find(path, "/", i, true)
        n = n + 1
        if not j then
            segs[n] = str_sub(path, i)
            break
        end
        segs[n] = str_sub(path, i, j - 1)
        i = j + 1
    end
    local list = gw.by_first[segs[1]] or gw.wild
    local allow
    for k = 1, #list do
        local r = list[k]
        local ok, last = match(r.t, segs, n)
        if ok then
            if r.verb == method or (method == "HEAD" and r.verb == "GET") then
                return r, segs, n, last
            end
            allow = allow or {}
            allow[r.verb] = true
        end
    end
    return nil, allow
end

local function path_value(v, segs, n, last)
    local first, lastidx = v.first, v.last
    if lastidx == -1 then
        lastidx = n
    end
    if first == lastidx then
        return decode_seg(first == n and last or segs[first], false)
    end
    local parts = {}
    for i = first, lastidx do
        parts[#parts + 1] = decode_seg(i == n and last or segs[i], true)
    end
    return tab_concat(parts, "/")
end

-- per worker: can ngx.var.qrpc_method / qrpc_route be set (declared with
-- `set` somewhere in the configuration)?
local method_var_ok, route_var_ok
local function set_method_var(v)
    ngx_var.qrpc_method = v
end
local function set_route_var(v)
    ngx_var.qrpc_route = v
end
local function set_vars(route)
    if method_var_ok ~= false then
        local ok = pcall(set_method_var, route.method)
        if method_var_ok == nil then
            method_var_ok = ok
        end
    end
    if route_var_ok ~= false then
        local ok = pcall(set_route_var, route.label)
        if route_var_ok == nil then
            route_var_ok = ok
        end
    end
end

local function error_of(err)
    if str_find(err, "^timeout") then
        return 504
    elseif str_find(err, "^connection lost") then
        return 502
    elseif str_find(err, "^unavailable") or str_find(err, "^connect")
           or str_find(err, "^queue full")
    then
        return 503
    elseif str_find(err, "^connection lost") or str_find(err, "^closed") then
        return 502
    elseif str_find(err, "^bad message") then
        return 400
    elseif str_find(err, "^bad response") then
        return 502
    elseif str_find(err, "^too large") then
        return 413
    end
    return 500
end

local function upstream_error(gw, err, route)
    local status = error_of(err)
    if status == 400 or status == 413 then
        return fail(status, err)
    end
    if status == 500 then
        ngx_log(ngx_ERR, "qrpc gateway: ", route and route.label or "", ": ", err)
    else
        ngx_log(ngx_WARN, "qrpc gateway: ", route and route.label or "", ": ", err)
    end
    if status == 503 then
        return fail(503, err, { ["Retry-After"] = tostring(gw.conf.retry_after) })
    end
    if status == 502 and str_find(err, "^bad response") then
        return write_error(502, 13, err)
    end
    return fail(status, err)
end

local DEFAULT_JSON = {
    bool = "false", string = "\"\"", bytes = "\"\"",
    double = "0", float = "0", int32 = "0", sint32 = "0", sfixed32 = "0",
    uint32 = "0", fixed32 = "0", int64 = "\"0\"", sint64 = "\"0\"",
    sfixed64 = "\"0\"", uint64 = "\"0\"", fixed64 = "\"0\"",
}

-- the response_body field of the answer's JSON text
local function response_field(gw, route, text)
    local f = route.resp_field
    local v, err = json.decode(text)
    if type(v) ~= "table" then
        return nil, "bad response: " .. route.output .. ": " .. tostring(err or "not an object")
    end
    local x = v[gw.conf.proto_names and f.name or f.json]
    if x == nil then
        x = v[f.name] or v[f.json]
    end
    if x == nil then
        if f.map then
            return "{}"
        elseif f.repeated then
            return "[]"
        elseif f.kind == "enum" then
            local e = gw.schema.enums[f.type]
            return e and json_encode(e.values[1]) or "0"
        elseif f.kind == "message" then
            return WKT_SCALAR[f.type] and "null" or "{}"
        end
        return DEFAULT_JSON[f.kind] or "null"
    end
    if f.repeated and type(x) == "table" and #x == 0 then
        return "[]"
    end
    return json_encode(x)
end


function _M.openapi_json(self)
    if not self.openapi_text then
        local doc, err = self:openapi()
        if not doc then
            return nil, err
        end
        self.openapi_text = json_encode(doc)
    end
    return self.openapi_text
end


local function serve(self)
    local ok, err = ensure(self)
    if not ok then
        return fail(500, "gateway not ready: " .. err)
    end
    local conf = self.conf
    local uri = ngx_var.request_uri
    local q = str_find(uri, "?", 1, true)
    local path = q and str_sub(uri, 1, q - 1) or uri
    local prefix = conf.prefix
    if prefix ~= "" then
        if str_sub(path, 1, #prefix) ~= prefix then
            return fail(404, "no route for " .. path)
        end
        path = str_sub(path, #prefix + 1)
        if path == "" then
            path = "/"
        elseif str_byte(path, 1) ~= 47 then
            return fail(404, "no route for " .. prefix .. path)
        end
    end
    local method = get_method()
    if conf.openapi and path == "/openapi.json" then
        if method ~= "GET" and method ~= "HEAD" then
            return fail(405, "method " .. method .. " not allowed", { Allow = "GET, HEAD" })
        end
        local text, oerr = self:openapi_json()
        if not text then
            return fail(500, oerr)
        end
        ngx_header["Content-Type"] = "application/json"
        ngx_print(text)
        return 200
    end

    local route, segs, n, last = find(self, method, path)
    if not route then
        if segs then
            local allow = {}
            for v in pairs(segs) do
                allow[#allow + 1] = v
            end
            tab_sort(allow)
            return fail(405, "method " .. method .. " not allowed for " .. prefix .. path,
                        { Allow = tab_concat(allow, ", ") })
        end
        return fail(404, "no route for " .. method .. " " .. prefix .. path)
    end
    set_vars(route)

    local want_pb = false
    local accept = ngx_var.http_accept
    if accept and (str_find(accept, "application/x-protobuf", 1, true)
                   or str_find(accept, "application/protobuf", 1, true))
       and not str_find(accept, "application/json", 1, true)
    then
        if route.resp_field then
            return fail(406, route.label .. " answers a field of " .. route.output
                             .. " (response_body): JSON only"), route
        end
        want_pb = true
    end

    -- the message: path variables, then the body, then the query string
    local msg, bound, pathvals = {}, {}, {}
    local vars = route.t.vars
    for i = 1, #vars do
        local v = vars[i]
        local s = path_value(v, segs, n, last)
        local f = v.chain[#v.chain]
        local cv, cerr = conv(value_kind(f), s)
        if cv == nil then
            return fail(400, "path {" .. v.field .. "}: " .. cerr), route
        end
        local sok, serr = set(msg, v.chain, cv, "path")
        if not sok then
            return fail(400, serr), route
        end
        pathvals[i] = cv
        bound[v.path] = true
    end

    local text
    local body_mode = route.body
    if body_mode ~= "" then
        local data, st = read_body(self)
        if not data then
            return fail(st, "request body larger than " .. conf.max_body .. " bytes"), route
        end
        if data ~= "" and not json_type(ngx_var.content_type) then
            return fail(415, "Content-Type must be application/json (got "
                             .. tostring(ngx_var.content_type or "none") .. ")"), route
        end
        if body_mode == "*" then
            if #vars == 0 then
                text = data ~= "" and data or "{}"
            elseif data ~= "" then
                local b, derr = body_decode(data)
                if b == nil then
                    return fail(400, "bad JSON body: " .. tostring(derr)), route
                end
                if type(b) ~= "table" or (#b > 0) then
                    return fail(400, "bad message: " .. route.input
                                     .. ": the body must be a JSON object"), route
                end
                for i = 1, #vars do
                    local v = vars[i]
                    local sok, serr = set(b, v.chain, pathvals[i], "path {" .. v.field .. "}")
                    if not sok then
                        return fail(400, serr), route
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
                        return fail(400, "bad JSON body: " .. tostring(derr)), route
                    end
                    msg[f.name] = b
                else
                    local b, derr = body_decode(data)
                    if b == nil then
                        return fail(400, "bad JSON body: " .. tostring(derr)), route
                    end
                    if type(b) ~= "table" then
                        return fail(400, "bad message: " .. route.input .. ": " .. f.name
                                         .. ": the body must be a JSON object"), route
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
                                return fail(400, serr), route
                            end
                        end
                    end
                    msg[f.name] = b
                end
            end
        end
    end
    if body_mode ~= "*" then
        local qok, qerr = add_query(self, route, msg, bound)
        if not qok then
            return fail(400, qerr), route
        end
    end
    if not text then
        local eerr
        text, eerr = json_encode(msg)
        if not text then
            return fail(400, "bad message: " .. route.input .. ": " .. tostring(eerr)), route
        end
    end

    local headers
    local fwd = conf.forward
    if fwd then
        local h = get_headers(100)
        for k, v in pairs(h) do
            k = str_lower(k)
            if pattern_match(fwd, k) then
                headers = headers or {}
                headers[k] = type(v) == "table" and tab_concat(v, ", ") or v
            end
        end
    end

    local conn, cerr = qrpc.connect(conf.upstream, conf.opts)
    if not conn then
        return upstream_error(self, cerr, route), route
    end
    local res, uerr = conn:unary(route.method, text, {
        request = route.input,
        response = not want_pb and route.output or nil,
        json = true,
        discard_unknown = conf.discard_unknown or nil,
        proto_names = conf.proto_names or nil,
        headers = headers,
    })
    if not res then
        return upstream_error(self, uerr, route), route
    end
    local rh = conf.response_headers
    if rh and res.headers then
        for k, v in pairs(res.headers) do
            if pattern_match(rh, str_lower(k)) then
                ngx_header[k] = v
            end
        end
    end
    if res.code ~= 0 then
        local status = conf.codes[res.code] or 500
        local body = res.body
        local message = body ~= "" and is_text(body) and body or ("code " .. res.code)
        return write_error(status, res.code, message), route
    end
    if want_pb then
        ngx_header["Content-Type"] = "application/x-protobuf"
        ngx_print(res.body)
        return 200, route
    end
    local out = res.body
    if route.resp_field then
        local rerr
        out, rerr = response_field(self, route, out)
        if not out then
            return upstream_error(self, rerr, route), route
        end
    end
    ngx_header["Content-Type"] = "application/json"
    ngx_print(out)
    return 200, route
end


-- Metrics: per worker, series -> cumulative value, added to qrpc.metrics()
-- (resty.ffi.qrpc.metrics' add_source). route is the template, never the
-- raw path: the label set is bounded by the routes (and "none" for a
-- request that matched none).
local counters = {}
metrics.add_source(counters)
local BOUNDS = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }
local LE = { "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005",
             "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5",
             "10" }
local series_of = {} -- route label -> its histogram's series names

local function label(s)
    return (str_gsub(s, '[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

local function record(route, method, status, secs)
    local r = route and route.label or "none"
    local ser = series_of[r]
    if not ser then
        local l = 'route="' .. label(r) .. '"'
        ser = { l = l, b = {}, sum = "qrpc_gateway_request_duration_seconds_sum{" .. l .. "}",
                count = "qrpc_gateway_request_duration_seconds_count{" .. l .. "}",
                inf = "qrpc_gateway_request_duration_seconds_bucket{" .. l .. ',le="+Inf"}' }
        for i = 1, #LE do
            ser.b[i] = "qrpc_gateway_request_duration_seconds_bucket{" .. l .. ',le="'
                       .. LE[i] .. '"}'
        end
        series_of[r] = ser
    end
    local key = "qrpc_gateway_requests_total{" .. ser.l .. ',method="' .. label(method)
                .. '",status="' .. status .. '"}'
    counters[key] = (counters[key] or 0) + 1
    for i = #BOUNDS, 1, -1 do
        if secs > BOUNDS[i] then
            break
        end
        local b = ser.b[i]
        counters[b] = (counters[b] or 0) + 1
    end
    counters[ser.inf] = (counters[ser.inf] or 0) + 1
    counters[ser.count] = (counters[ser.count] or 0) + 1
    counters[ser.sum] = (counters[ser.sum] or 0) + secs
end


-- The durations come from CLOCK_MONOTONIC (ngx.now() has millisecond
-- steps, coarser than the histogram's first buckets). Declared under
-- pcall: another module may have declared them already.
pcall(ffi.cdef, "struct timespec { long tv_sec; long tv_nsec; };")
pcall(ffi.cdef, "int clock_gettime(int clk_id, struct timespec *tp);")
local C = ffi.C
local ts = ffi.new("struct timespec")
local CLOCK_MONOTONIC = 1

local function mono()
    C.clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end


-- gw:serve(): answers this request (content phase).
function _M.serve(self)
    if type(self) ~= "table" or getmetatable(self) ~= mt then
        return nil, "bad argument #1: a gateway is expected (use gw:serve(), not gw.serve())"
    end
    local t0 = mono()
    local status, route = serve(self)
    record(route, get_method(), status or ngx.status, mono() - t0)
    return status
end


-------------------------------------------------------------------------
-------------------------------------------------------------------------
-- OpenAPI 3.1
-------------------------------------------------------------------------

local function scalar_schema(kind)
    if kind == "int32" or kind == "sint32" or kind == "sfixed32" then
        return { type = "integer", format = "int32" }
    elseif kind == "uint32" or kind == "fixed32" then
        return { type = "integer", format = "int64", minimum = 0, maximum = 4294967295 }
    elseif kind == "int64" or kind == "sint64" or kind == "sfixed64" then
        return { type = "string", format = "int64", pattern = "^-?[0-9]+$" }
    elseif kind == "uint64" or kind == "fixed64" then
        return { type = "string", format = "uint64", pattern = "^[0-9]+$" }
    elseif kind == "double" then
        return { type = "number", format = "double" }
    elseif kind == "float" then
        return { type = "number", format = "float" }
    elseif kind == "bool" then
        return { type = "boolean" }
    elseif kind == "bytes" then
        return { type = "string", contentEncoding = "base64" }
    end
    return { type = "string" }
end

local WKT_SCHEMA = {
    ["google.protobuf.Timestamp"] = { type = "string", format = "date-time" },
    ["google.protobuf.Duration"] = { type = "string", pattern = "^-?[0-9]+(\\.[0-9]+)?s$" },
    ["google.protobuf.FieldMask"] = { type = "string" },
    ["google.protobuf.Empty"] = { type = "object" },
    ["google.protobuf.Struct"] = { type = "object", additionalProperties = true },
    ["google.protobuf.Value"] = {},
    ["google.protobuf.ListValue"] = { type = "array", items = {} },
    ["google.protobuf.Any"] = {
        type = "object", required = { "@type" }, additionalProperties = true,
        properties = { ["@type"] = { type = "string" } },
    },
}

local function ref(name)
    return { ["$ref"] = "#/components/schemas/" .. name }
end

local function field_schema(f, need)
    local s
    if f.kind == "message" then
        need[f.type] = true
        s = ref(f.type)
    elseif f.kind == "enum" then
        need[f.type] = true
        s = ref(f.type)
    else
        s = scalar_schema(f.kind)
    end
    if f.map then
        s = { type = "object", additionalProperties = s }
    elseif f.repeated then
        s = { type = "array", items = s }
    end
    if f.comment and f.comment ~= "" then
        s.description = f.comment
    end
    return s
end

local function message_schema(gw, name, need)
    if WKT_SCHEMA[name] then
        return WKT_SCHEMA[name]
    end
    local w = WKT_SCALAR[name]
    if w then
        local s = scalar_schema(w)
        return { anyOf = { s, { type = "null" } } }
    end
    local m = gw.schema.messages[name]
    local props = {}
    for _, f in ipairs(m.fields) do
        props[gw.conf.proto_names and f.name or f.json] = field_schema(f, need)
    end
    local s = { type = "object", properties = props }
    if m.comment and m.comment ~= "" then
        s.description = m.comment
    end
    return s
end

-- query parameters of a message's fields, flattened (a.b), skipping bound
local function query_params(gw, msg, prefix, bound, out, depth, seen)
    local m = gw.schema.messages[msg]
    if not m or depth > 3 or seen[msg] then
        return
    end
    seen[msg] = true
    for _, f in ipairs(m.fields) do
        local name = prefix .. f.name
        if not (prefix == "" and bound[f.name]) and not f.map then
            local kind = value_kind(f)
            if kind then
                local s
                if f.kind == "enum" then
                    local e = gw.schema.enums[f.type]
                    s = { type = "string", enum = e and e.values or empty_array }
                else
                    s = scalar_schema(kind)
                end
                local p = { name = name, ["in"] = "query", schema = s }
                if f.repeated then
                    p.schema = { type = "array", items = s }
                    p.explode = true
                    p.style = "form"
                end
                if f.comment and f.comment ~= "" then
                    p.description = f.comment
                end
                out[#out + 1] = p
            elseif f.kind == "message" and not f.repeated then
                query_params(gw, f.type, name .. ".", bound, out, depth + 1, seen)
            end
        end
    end
    seen[msg] = nil
end

local OPENAPI_METHODS = {
    GET = "get", PUT = "put", POST = "post", DELETE = "delete", PATCH = "patch",
    HEAD = "head", OPTIONS = "options", TRACE = "trace",
}

function _M.openapi(self)
    local ok, err = ensure(self)
    if not ok then
        return nil, err
    end
    local conf = self.conf
    local need = {}
    local paths = {}
    local op_ids = {}
    for _, r in ipairs(self.routes) do
        local verb = OPENAPI_METHODS[r.verb]
        if verb then
            -- the OpenAPI path: variables as {field}, unnamed wildcards as {_N}
            local parts, params, pi = {}, {}, 0
            local var_at = {}
            for _, v in ipairs(r.t.vars) do
                var_at[v.first] = v
            end
            local i = 1
            local pat = r.t.pattern
            while i <= #pat do
                local v = var_at[i]
                if v then
                    parts[#parts + 1] = "{" .. v.field .. "}"
                    local f = v.chain[#v.chain]
                    local s
                    if f.kind == "enum" then
                        local e = self.schema.enums[f.type]
                        s = { type = "string", enum = e and e.values or empty_array }
                    else
                        s = scalar_schema(value_kind(f))
                    end
                    local desc = f.comment or ""
                    local last = v.last == -1 and #pat or v.last
                    if last > v.first or pat[v.first] ~= STAR then
                        local sub = {}
                        for j = v.first, last do
                            local p = pat[j]
                            sub[#sub + 1] = p == STAR and "*" or p == DSTAR and "**" or p
                        end
                        desc = (desc ~= "" and desc .. "\n\n" or "")
                               .. "Matches `" .. tab_concat(sub, "/") .. "`."
                    end
                    params[#params + 1] = { name = v.field, ["in"] = "path", required = true,
                                            schema = s,
                                            description = desc ~= "" and desc or nil }
                    i = last + 1
                else
                    local p = pat[i]
                    if type(p) == "string" then
                        parts[#parts + 1] = p
                    else
                        pi = pi + 1
                        local pname = "_" .. pi
                        parts[#parts + 1] = "{" .. pname .. "}"
                        params[#params + 1] = {
                            name = pname, ["in"] = "path", required = true,
                            schema = { type = "string" },
                            description = p == DSTAR and "Any path (`**`)." or "Any segment (`*`).",
                        }
                    end
                    i = i + 1
                end
            end
            local opath = conf.prefix .. "/" .. tab_concat(parts, "/")
            if r.t.verb then
                opath = opath .. ":" .. r.t.verb
            end
            local item = paths[opath]
            if not item then
                item = {}
                paths[opath] = item
            end
            if not item[verb] then
                local bound = {}
                for _, v in ipairs(r.t.vars) do
                    bound[v.chain[1].name] = true
                end
                local op = {
                    tags = { r.service },
                    summary = r.name,
                    description = r.comment ~= "" and r.comment or nil,
                    responses = {
                        ["200"] = {
                            description = "OK",
                            content = { ["application/json"] = {
                                schema = r.resp_field and field_schema(r.resp_field, need)
                                         or (function()
                                             need[r.output] = true
                                             return ref(r.output)
                                         end)(),
                            } },
                        },
                        ["4XX"] = {
                            description = "A bad request: no route, a bad field, ...",
                            content = { ["application/json"] = {
                                schema = ref("qrpc.gateway.Error"),
                            } },
                        },
                        default = {
                            description = "An error",
                            content = { ["application/json"] = {
                                schema = ref("qrpc.gateway.Error"),
                            } },
                        },
                    },
                }
                local id = str_gsub(r.full, "%.", "_")
                if op_ids[id] then
                    op_ids[id] = op_ids[id] + 1
                    id = id .. "_" .. op_ids[id]
                else
                    op_ids[id] = 1
                end
                op.operationId = id
                if r.body == "*" then
                    need[r.input] = true
                    op.requestBody = { required = false, content = {
                        ["application/json"] = { schema = ref(r.input) } } }
                elseif r.body_field then
                    bound[r.body_field.name] = true
                    op.requestBody = { required = false, content = {
                        ["application/json"] = { schema = field_schema(r.body_field, need) } } }
                end
                if r.body ~= "*" then
                    query_params(self, r.input, "", bound, params, 1, {})
                end
                if #params > 0 then
                    op.parameters = params
                end
                item[verb] = op
            end
        end
    end
    -- the schemas that were referred to, and what they refer to
    local schemas = {}
    local todo = true
    while todo do
        todo = false
        for name in pairs(need) do
            if not schemas[name] then
                todo = true
                if self.schema.enums[name] then
                    local e = self.schema.enums[name]
                    schemas[name] = { type = "string", enum = e.values,
                                      description = e.comment ~= "" and e.comment or nil }
                else
                    schemas[name] = message_schema(self, name, need)
                end
            end
        end
    end
    schemas["qrpc.gateway.Error"] = {
        type = "object",
        description = "The body of every error answer.",
        required = { "code", "message", "details" },
        properties = {
            code = { type = "integer", format = "int32",
                     description = "The qrpc code of the service's answer, or the gRPC "
                                   .. "code of the gateway's own error." },
            message = { type = "string" },
            details = { type = "array", items = { type = "object" } },
        },
    }
    local info = conf.openapi_info
    local title = info.title
    if not title then
        local names = {}
        for _, s in ipairs(self.schema.services) do
            names[#names + 1] = s.name
        end
        title = tab_concat(names, ", ")
        if title == "" then
            title = "qrpc gateway"
        end
    end
    local desc = info.description
    local svc1 = self.schema.services[1]
    if not desc and #self.schema.services == 1 and (svc1.comment or "") ~= "" then
        desc = svc1.comment
    end
    local tags = {}
    for _, s in ipairs(self.schema.services) do
        tags[#tags + 1] = { name = s.name,
                            description = (s.comment or "") ~= "" and s.comment or nil }
    end
    return {
        openapi = "3.1.0",
        info = { title = title, version = info.version or "1.0.0", description = desc },
        servers = { { url = "/" } },
        tags = tags,
        paths = paths,
        components = { schemas = schemas },
    }
end

return _M
