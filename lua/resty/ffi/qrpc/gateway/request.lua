-- resty.ffi.qrpc.gateway.request: the qrpc request of an HTTP request: the
-- message (JSON text) from the path variables, the query string and the
-- body (its Content-Type and max_body checked), and the forwarded headers.

local json = require "resty.ffi.qrpc.json"
local schema = require "resty.ffi.qrpc.gateway.schema"
local routes = require "resty.ffi.qrpc.gateway.routes"
local config = require "resty.ffi.qrpc.gateway.config"
local params = require "resty.ffi.qrpc.gateway.params"
local body = require "resty.ffi.qrpc.gateway.body"
local httpbody = require "resty.ffi.qrpc.gateway.httpbody"

local ngx = ngx
local ngx_var = ngx.var
local ngx_req = ngx.req
local get_headers = ngx_req.get_headers
local get_method = ngx_req.get_method

local type = type
local pcall = pcall
local pairs = pairs
local tostring = tostring
local getmetatable = getmetatable
local str_sub = string.sub
local str_byte = string.byte
local ipairs = ipairs
local tab_concat = table.concat

local json_encode = json.encode_body
local value_kind = schema.value_kind
local path_value = routes.path_value
local pattern_match = config.pattern_match
local update_mask = require("resty.ffi.qrpc.gateway.mask").update_mask
local conv, conv_list, set = params.conv, params.conv_list, params.set
local add_query, form_message = params.add_query, params.form_message
local read_body, json_type, form_type = body.read, body.json_type, body.form_type
local json_text = body.json_text

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

-- The marks of a decoded JSON array (json's own and lua-cjson's).
local array_mts = {}
for _, mt in ipairs(json.array_mts) do
    array_mts[mt] = true
end

-- is b, a decoded body, a JSON object? (an empty [] is no object either)
local function is_object(b)
    return type(b) == "table" and #b == 0 and not array_mts[getmetatable(b)]
end

-- The methods whose form body net/http's ParseForm reads.
local FORM_METHODS = { POST = true, PUT = true, PATCH = true }

local _M = {}

-- message(gw, route, segs, n, last, form_get) -> JSON text | protobuf
-- bytes, true | nil, status, err: the request message of a matched route
-- (find's segs, n, last; form_get: a form POST served by a GET route,
-- grpc-gateway's path length fallback)
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
        if route.raw_in then
            -- a google.api.HttpBody: the body as it came, and its type
            local f = route.body_field
            if not f and #vars == 0 then
                local pb, herr = httpbody.encode(data, ct or "")
                if not pb then
                    return nil, 400, "bad message: " .. route.input .. ": " .. herr
                end
                return pb, true
            end
            local hb = httpbody.request(data, ct or "")
            local into = msg
            if f then
                into = msg[f.name]
            end
            if type(into) == "table" then
                -- path variables set over it, as over a JSON body
                for k, v in pairs(into) do
                    hb[k] = v
                end
            end
            if f then
                bound[f.name] = true
                msg[f.name] = hb
            else
                msg = hb
            end
            data = ""
            form = true
        elseif data ~= "" and not json_type(ct) then
            local is_form = conf.form_body and form_type(ct)
            -- JSON text sent as a form is read as JSON: curl -d sends every
            -- body with the form type, and a form whose first name starts
            -- with "{" or "[" names no field
            local jtext = is_form and json_text(data)
            local fbody = route.body_field
            if is_form and not jtext and (not fbody or fbody.kind == "message") then
                local fok, fst, ferr = form_message(gw, route, msg, bound, data,
                                                    route.mask_field and conf.patch_update_mask)
                if not fok then
                    return nil, fst, ferr
                end
                -- the paths of the form's fields, for the update_mask
                mask = fst
                data = ""
                form = true
            elseif jtext or conf.default_content_type then -- luacheck: ignore 542
                -- read as JSON, as grpc-gateway's wildcard marshaler reads a
                -- body of a type it has no marshaler for, or of none
            elseif is_form then
                return nil, 415, "a form body needs a message field as the body ("
                                 .. fbody.name .. " is not one)"
            else
                return nil, 415, "Content-Type must be application/json (got "
                              .. tostring(ct or "none") .. ")"
            end
        end
        if form then -- luacheck: ignore 542
            -- the fields are set (a form, an HttpBody)
        elseif body_mode == "*" then
            if #vars == 0 then
                text = data ~= "" and data or "{}"
            elseif data ~= "" then
                local b, derr = body_decode(data)
                if b == nil then
                    return nil, 400, "bad JSON body: " .. tostring(derr)
                end
                if not is_object(b) then
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
                    if not is_object(b) then
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
        -- a form body of a route that takes none adds to the query string
        -- (grpc-gateway's ParseForm)
        local form_args
        if body_mode == "" and (form_get or gw.conf.form_body and FORM_METHODS[get_method()]
                                              and form_type(ngx_var.content_type)) then
            local st
            form_args, st = read_body(gw)
            if not form_args then
                return nil, st, "request body larger than " .. gw.conf.max_body .. " bytes"
            end
        end
        local qok, qst, qerr = add_query(gw, route, msg, bound, form_args)
        if not qok then
            return nil, qst, qerr
        end
        -- grpc-gateway derives the mask when the request's has no paths
        local mf = route.mask_field
        local given = mask and msg[mf.name]
        if mask and given == nil then
            given = msg[mf.json]
        end
        if mask and (given == nil or given == "") then
            msg[mf.json] = nil
            msg[mf.name] = #mask > 0 and { paths = mask } or {}
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
