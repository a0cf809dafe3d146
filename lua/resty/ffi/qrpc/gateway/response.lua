-- resty.ffi.qrpc.gateway.response: the answer to an HTTP request from the
-- qrpc result: JSON (the whole message or its response_body field), or
-- the protobuf bytes for a client that accepts only those; a code other
-- than 0 as an error answer.

local json = require "resty.ffi.qrpc.json"
local schema = require "resty.ffi.qrpc.gateway.schema"
local errors = require "resty.ffi.qrpc.gateway.errors"
local config = require "resty.ffi.qrpc.gateway.config"
local httpbody = require "resty.ffi.qrpc.gateway.httpbody"
local utf8_valid = require("resty.ffi.qrpc.gateway.utf8").valid

local ngx = ngx
local ngx_var = ngx.var
local ngx_header = ngx.header
local ngx_print = ngx.print
local ngx_log = ngx.log
local ngx_WARN = ngx.WARN

local type = type
local pairs = pairs
local ipairs = ipairs
local null = ngx.null
local tab_concat = table.concat
local tostring = tostring
local str_find = string.find
local str_lower = string.lower
local nkeys = require "table.nkeys"

local json_encode = json.encode
local WKT_SCALAR = schema.WKT_SCALAR
local write_error = errors.write_error
local upstream_error = errors.upstream_error
local pattern_match = config.pattern_match

local _M = {}

-- is s valid UTF-8 text (no NUL)?
local function is_text(s)
    return not str_find(s, "%z") and utf8_valid(s)
end


local DEFAULT_JSON = {
    bool = "false", string = "\"\"", bytes = "\"\"",
    double = "0", float = "0", int32 = "0", sint32 = "0", sfixed32 = "0",
    uint32 = "0", fixed32 = "0", int64 = "\"0\"", sint64 = "\"0\"",
    sfixed64 = "\"0\"", uint64 = "\"0\"", fixed64 = "\"0\"",
}

-- The JSON of a nil message of a well-known type, as protojson writes
-- it (wrappers: their value's zero, from DEFAULT_JSON). Value has none
-- (protojson refuses a Value that sets no kind): not here.
local WKT_ZERO = {
    ["google.protobuf.Timestamp"] = "\"1970-01-01T00:00:00Z\"",
    ["google.protobuf.Duration"] = "\"0s\"",
    ["google.protobuf.FieldMask"] = "\"\"",
    ["google.protobuf.Struct"] = "{}",
    ["google.protobuf.ListValue"] = "[]",
    ["google.protobuf.Any"] = "{}",
    ["google.protobuf.Empty"] = "{}",
}

-- compat_zero(gw, f) -> what grpc-gateway writes for the message field f
-- named by response_body when the answer leaves it unset: it marshals the
-- field's value, a nil message, and protojson writes a nil message as
-- the empty one: {} without emit_unpopulated, with it every field outside
-- a oneof (proto3 optional ones included there) in declaration order,
-- null for a field with presence (a message, proto2 optional, editions'
-- explicit presence), the zero value for the others.
local function compat_zero(gw, f)
    local t = f.type
    local z = WKT_ZERO[t]
    if z then
        return z
    end
    if WKT_SCALAR[t] then
        return DEFAULT_JSON[WKT_SCALAR[t]]
    end
    if t == "google.protobuf.Value" then
        -- grpc-gateway fails there (gateway.md's table of differences)
        return "null"
    end
    local m = gw.schema.messages[t]
    if not gw.conf.emit_unpopulated or not m or not m.fields then
        return "{}"
    end
    local names = gw.conf.proto_names
    local out, n = {}, 0
    for _, g in ipairs(m.fields) do
        if not g.oneof and not g.optional then
            local v
            if g.map then
                v = "{}"
            elseif g.repeated then
                v = "[]"
            elseif g.presence or g.kind == "message"
                   or g.type == "google.protobuf.NullValue"
            then
                v = "null"
            elseif g.kind == "enum" then
                v = "0"
                local e = gw.schema.enums[g.type]
                for i = 1, e and #e.numbers or 0 do
                    if e.numbers[i] == 0 then
                        v = json_encode(e.values[i])
                        break
                    end
                end
            else
                v = DEFAULT_JSON[g.kind] or "null"
            end
            n = n + 1
            out[n] = json_encode(names and (g.text or g.name) or g.json) .. ":" .. v
        end
    end
    return "{" .. tab_concat(out, ",") .. "}"
end

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
    if gw.conf.compat and f.kind == "message" and not f.repeated and not f.map
       and (x == nil or x == null)
    then
        -- an unset message field (null with emit_unpopulated): written
        -- as grpc-gateway writes it, once per route
        local z = route.compat_zero
        if not z then
            z = compat_zero(gw, f)
            route.compat_zero = z
        end
        return z
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

-- protobuf(route) -> true (the client accepts only protobuf), false | nil,
-- 406, err (a response_body route, which answers JSON only). An HttpBody
-- answer is its data whatever the client accepts, as in grpc-gateway.
function _M.protobuf(route)
    local accept = ngx_var.http_accept
    if accept and not route.raw_out and (str_find(accept, "application/x-protobuf", 1, true)
                   or str_find(accept, "application/protobuf", 1, true))
       and not str_find(accept, "application/json", 1, true)
    then
        if route.resp_field then
            return nil, 406, route.label .. " answers a field of " .. route.output
                             .. " (response_body): JSON only"
        end
        return true
    end
    return false
end

-- MAX_FORWARDED is the most answer headers written into the HTTP
-- response: each ngx.header assignment searches the headers set before
-- it, so N of them cost N^2 (20,000 blocked the event loop for over a
-- second). An answer with more is a 502, as nginx answers an upstream
-- whose headers do not fit its buffer.
local MAX_FORWARDED = 100
_M.MAX_FORWARDED = MAX_FORWARDED

-- forwarded(conf, hdrs) -> how many HTTP headers write would set from
-- the answer's
local function forwarded(conf, hdrs)
    local n = conf.grpc_metadata and nkeys(hdrs) or 0
    local rh = conf.response_headers
    if rh then
        for k in pairs(hdrs) do
            if pattern_match(rh, str_lower(k)) then
                n = n + 1
            end
        end
    end
    return n
end

-- write(gw, route, res, want_pb) -> status: answers with the unary's result
function _M.write(gw, route, res, want_pb)
    local conf = gw.conf
    local rh = conf.response_headers
    if (rh or conf.grpc_metadata) and res.headers then
        local n = forwarded(conf, res.headers)
        if n > MAX_FORWARDED then
            local msg = "too many response headers (" .. n .. "; at most " .. MAX_FORWARDED .. ")"
            ngx_log(ngx_WARN, "qrpc gateway: ", route.label, ": ", msg)
            return write_error(502, 13, msg)
        end
    end
    if rh and res.headers then
        for k, v in pairs(res.headers) do
            if pattern_match(rh, str_lower(k)) then
                ngx_header[k] = v
            end
        end
    end
    if conf.grpc_metadata and res.headers then
        -- every header of the answer, as grpc-gateway returns metadata
        for k, v in pairs(res.headers) do
            ngx_header["Grpc-Metadata-" .. k] = v
        end
    end
    if res.code ~= 0 then
        local status = conf.codes[res.code] or 500
        local body = res.body
        local message = body ~= "" and is_text(body) and body or ("code " .. res.code)
        if status == 401 then
            -- HTTP requires a challenge with 401: the service's own, else
            -- the message (what grpc-gateway sends)
            local hdrs = res.headers
            local challenge = hdrs and (hdrs["www-authenticate"] or hdrs["WWW-Authenticate"])
            return write_error(status, res.code, message,
                               { ["WWW-Authenticate"] = type(challenge) == "string"
                                                        and challenge or message })
        end
        return write_error(status, res.code, message)
    end
    if route.raw_out then
        local ct, data = httpbody.answer(route, res.body)
        if not ct then
            return upstream_error(gw, data, route)
        end
        ngx_header["Content-Type"] = ct ~= "" and ct or "application/octet-stream"
        ngx_print(data)
        return 200
    end
    if want_pb then
        ngx_header["Content-Type"] = "application/x-protobuf"
        ngx_print(res.body)
        return 200
    end
    local out = res.body
    if route.resp_field then
        local rerr
        out, rerr = response_field(gw, route, out)
        if not out then
            return upstream_error(gw, rerr, route)
        end
    end
    ngx_header["Content-Type"] = "application/json"
    ngx_print(out)
    return 200
end

return _M
