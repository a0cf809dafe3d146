-- resty.ffi.qrpc.gateway.routes: the route table of a gateway, from the
-- google.api.http options of its methods and the routes given by hand;
-- path templates (google/api/http.proto), parsed and matched.

local schema_mod = require "resty.ffi.qrpc.gateway.schema"
local httpbody = require "resty.ffi.qrpc.gateway.httpbody"

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR

local type = type
local ipairs = ipairs
local tonumber = tonumber
local str_byte = string.byte
local str_char = string.char
local str_find = string.find
local str_sub = string.sub
local str_gsub = string.gsub
local str_match = string.match
local tab_concat = table.concat
local tab_sort = table.sort
local tab_remove = table.remove

local field_of = schema_mod.field_of
local chain = schema_mod.chain
local path_of = schema_mod.path_of
local WKT_SCALAR = schema_mod.WKT_SCALAR

local _M = {}

-- The wildcards of a template's pattern (the other elements are literals).
local STAR, DSTAR = 1, 2
_M.STAR, _M.DSTAR = STAR, DSTAR

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

-- http.proto's LITERAL is RFC 3986 pchars: ":" included
local function check_literal(s)
    return s ~= "" and not str_find(s, "[{}*/?#%s]")
end
local check_verb = check_literal

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
    -- the verb: ":name" after the last segment, outside braces. As
    -- grpc-gateway reads it: after a variable, everything past the first
    -- colon ("{uuid}:custom:custom" has the verb "custom:custom"); after a
    -- literal, past the last one (a literal may hold colons).
    local last = segs[#segs]
    local depth, colon, var_end = 0, nil, nil
    for i = 1, #last do
        local c = str_byte(last, i)
        if c == 123 then
            depth = depth + 1
        elseif c == 125 then
            depth = depth - 1
            if depth == 0 then
                var_end, colon = i, nil
            end
        elseif c == 58 and depth == 0 and not (var_end and colon) then
            colon = i
        end
    end
    if colon then
        verb = str_sub(last, colon + 1)
        if not check_verb(verb) then
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
_M.parse_template = parse_template


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
            return nil, "path " .. err
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
            return nil, "{" .. v.field .. "}: " .. err
        end
        local leaf = ch[#ch]
        local msg = leaf.kind == "message"
        if leaf.map or msg and (leaf.repeated or not WKT_SCALAR[leaf.type]) then
            return nil, "{" .. v.field .. "} must name a scalar field or a repeated one"
        end
        -- a repeated field's segment is its values joined with ",", as
        -- grpc-gateway reads it
        v.repeated = leaf.repeated or nil
        v.chain = ch
        v.path = path_of(ch)
    end
    if route.body ~= "" and route.body ~= "*" then
        local f = field_of(schema, m.input, route.body)
        if not f then
            return nil, "body: no field " .. route.body .. " in " .. m.input
        end
        route.body_field = f
        -- a PATCH of a message field may get its update_mask from the body
        -- (patch_update_mask), as grpc-gateway gives it
        local mf = field_of(schema, m.input, "update_mask")
        if r.verb == "PATCH" and f.kind == "message" and mf and not mf.repeated
           and mf.type == "google.protobuf.FieldMask"
        then
            route.mask_field = mf
        end
    end
    if route.response_body ~= "" then
        local f = field_of(schema, m.output, route.response_body)
        if not f then
            return nil, "response_body: no field " .. route.response_body .. " in " .. m.output
        end
        route.resp_field = f
    end
    return httpbody.bind(route, m.input, m.output, route.body_field)
end

local function build(gw)
    local conf = gw.conf
    local schema, methods = schema_mod.load(conf)
    if not schema then
        return nil, methods
    end
    gw.schema = schema
    gw.chains = {} -- query parameter names -> field chains (query_chain)

    -- A binding that cannot be served costs its own route, not the API:
    -- it is logged once, left out of the table and of the OpenAPI
    -- document (which names it under x-qrpc-skipped).
    local routes, seen, skipped = {}, {}, {}
    local function skip(file, method, rule, reason)
        skipped[#skipped + 1] = { file = file, method = method, rule = rule, reason = reason }
        ngx_log(ngx_ERR, "qrpc gateway: skipped ", rule, " of ", method, " (", file,
                "): ", reason)
    end
    local function add(r, m, file)
        local rule = r.verb .. " " .. conf.prefix .. r.tpl
        local route, err = bind_route(gw, r, m)
        if not route then
            return skip(file, m.full, rule, err)
        end
        local k = route.verb .. " " .. route.t.key .. " " .. str_gsub(r.tpl, "{[^}]*}", "{}")
        local prev = seen[k]
        if prev then
            if prev.hand and not route.hand then
                return
            end
            if not (route.hand and not prev.hand) then
                return skip(file, m.full, rule, "the same path as " .. prev.full)
            end
            for i, x in ipairs(routes) do
                if x == prev then
                    tab_remove(routes, i)
                    break
                end
            end
        end
        seen[k] = route
        routes[#routes + 1] = route
    end
    for _, r in ipairs(conf.hand) do
        local m = methods[r.method]
        if m then
            add(r, m, "routes")
        else
            skip("routes", r.method, r.verb .. " " .. conf.prefix .. r.tpl,
                 "no method " .. r.method .. " in " .. tab_concat(conf.files, ", "))
        end
    end
    for _, svc in ipairs(schema.services) do
        for _, m in ipairs(svc.methods) do
            if not m.stream then
                for _, h in ipairs(m.http or {}) do
                    add({ verb = h.method, tpl = h.path, body = h.body,
                          response_body = h.response_body }, m, m.file)
                end
            end
        end
    end
    gw.skipped = skipped
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
_M.ensure = ensure
_M.build = build


-------------------------------------------------------------------------
-- Matching a request
-------------------------------------------------------------------------

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
    local allow, get, get_last
    for k = 1, #list do
        local r = list[k]
        local ok, last = match(r.t, segs, n)
        if ok then
            if r.verb == method then
                return r, segs, n, last
            end
            -- HEAD: a HEAD route of the path first, else its GET route
            if method == "HEAD" and r.verb == "GET" and not get then
                get, get_last = r, last
            end
            allow = allow or {}
            allow[r.verb] = true
        end
    end
    if get then
        return get, segs, n, get_last
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

_M.find = find
_M.path_value = path_value

return _M
