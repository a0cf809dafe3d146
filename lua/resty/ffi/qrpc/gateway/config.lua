-- resty.ffi.qrpc.gateway.config: gateway.new's options, checked into the
-- configuration a gateway keeps (routes given by hand are parsed here and
-- bound to methods in the worker), and the header name patterns.

local proto = require "resty.ffi.qrpc.proto"
local routes = require "resty.ffi.qrpc.gateway.routes"
local errors = require "resty.ffi.qrpc.gateway.errors"
local cache = require "resty.ffi.qrpc.cache"
local args = require "resty.ffi.qrpc.args"
local pool = require "resty.ffi.qrpc.pool"

local type = type
local pairs = pairs
local ipairs = ipairs
local pcall = pcall
local tostring = tostring
local math_floor = math.floor
local str_find = string.find
local str_sub = string.sub
local str_gsub = string.gsub
local str_lower = string.lower
local str_match = string.match
local tab_sort = table.sort

local parse_template = routes.parse_template
local GRPC_CODES = errors.GRPC_CODES

local _M = {}

local OPTIONS = {
    upstream = true, opts = true, protos = true, prefix = true, routes = true,
    codes = true, max_body = true, method_name = true, discard_unknown = true,
    forward_headers = true, response_headers = true, openapi = true,
    retry_after = true, proto_names = true,
    compat = true, default_content_type = true, grpc_metadata = true,
    patch_update_mask = true, form_body = true, emit_unpopulated = true,
}

-- compat = "grpc-gateway": the defaults of the options a grpc-gateway
-- client relies on (an option given explicitly wins)
local PRESETS = {
    ["grpc-gateway"] = {
        default_content_type = "application/json", grpc_metadata = true,
        patch_update_mask = true, form_body = true, emit_unpopulated = true,
        -- its default unmarshaler's DiscardUnknown, and query parameters
        -- it finds no field for are skipped
        discard_unknown = true,
    },
}

local function bad(what)
    return nil, "bad argument #1: " .. what
end

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

-- int_option(c, k, default, max, unit) -> c[k] (default when nil), an
-- integer 0..max | nil, err
local function int_option(c, k, default, max, unit)
    local v = c[k]
    if v == nil then
        return default
    end
    if type(v) ~= "number" or v < 0 or v ~= math_floor(v) or v > max then
        return bad(k .. " must be an integer 0.." .. max .. " (" .. unit .. ")")
    end
    return v
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
    -- qrpc.connect's own checks of upstream and opts, which load nothing:
    -- a mistake there is told now, not as a 500 on every request
    local o, cerr = args.plain_connect_opts(conf.opts)
    if o then
        local spec
        spec, cerr = pool.check(up, o)
        if spec then
            local pins, perr = args.check_connect_opts(o)
            cerr = not pins and perr or nil
        end
        if not cerr and o.methods ~= nil then
            -- checked by connect once it has dialled
            local own, berr = proto.bind(o.methods)
            cerr = not own and berr or nil
        end
    end
    if cerr then
        local n, what = str_match(cerr, "^bad argument #(%d): (.*)$")
        if n ~= "1" then
            return bad("opts: " .. (what or cerr))
        end
        -- connect names its first argument addr, addrs or addrs[i]; the
        -- user of gateway.new wrote upstream
        local named, k = str_gsub(what, "^addrs?([%[ :])", "upstream%1")
        return bad(k > 0 and named or "upstream: " .. what)
    end
    -- the calls' deadline, which a Grpc-Timeout may shorten
    local copt_t = conf.opts.timeout
    conf.timeout = type(copt_t) == "number" and copt_t > 0 and copt_t or cache.DEFAULT_TIMEOUT_MS

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

    conf.max_body, err = int_option(c, "max_body", 1048576, 2147483647, "bytes")
    if not conf.max_body then
        return nil, err
    end
    conf.retry_after, err = int_option(c, "retry_after", 1, 86400, "seconds")
    if not conf.retry_after then
        return nil, err
    end

    if c.proto_names ~= nil and type(c.proto_names) ~= "boolean" then
        return bad("proto_names must be a boolean")
    end
    conf.proto_names = c.proto_names == true

    local preset = {}
    if c.compat ~= nil then
        preset = PRESETS[c.compat]
        if not preset then
            return bad("compat must be \"grpc-gateway\" (got " .. tostring(c.compat) .. ")")
        end
    end
    conf.compat = c.compat
    for _, k in ipairs({ "grpc_metadata", "patch_update_mask", "form_body", "emit_unpopulated",
                         "discard_unknown" }) do
        local v = c[k]
        if v == nil then
            v = preset[k] or false
        elseif type(v) ~= "boolean" then
            return bad(k .. " must be a boolean")
        end
        conf[k] = v
    end
    local dct = c.default_content_type
    if dct == nil then
        dct = preset.default_content_type
    elseif dct ~= "application/json" and dct ~= false then
        return bad("default_content_type must be \"application/json\" or false")
    end
    conf.default_content_type = dct or nil

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


-- check(c) -> conf | nil, err: gateway.new's options, checked (an error
-- the options raise, e.g. from a metatable, comes back as an error too)
function _M.check(c)
    local ok, conf, err = pcall(check_conf, c)
    if not ok then
        return bad("options raised an error: " .. tostring(conf))
    end
    return conf, err
end

_M.pattern_match = pattern_match

return _M
