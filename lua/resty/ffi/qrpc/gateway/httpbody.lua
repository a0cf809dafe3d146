-- resty.ffi.qrpc.gateway.httpbody: google.api.HttpBody, raw HTTP bodies
-- both ways. A request whose body is an HttpBody (the whole message, or
-- the field `body:` names) carries the body as it came and its
-- Content-Type, as Envoy's transcoder takes it; an answer that is one
-- (the whole message, or the `response_body` field) is written as its
-- data with its content_type, as grpc-gateway serves it.
--
-- The answer is read here from the protobuf bytes rather than from Go's
-- JSON: the data then crosses no base64, and only the two fields that
-- make the HTTP answer are looked at (extensions are not).

local utf8_valid = require("resty.ffi.qrpc.gateway.utf8").valid

local ngx = ngx
local encode_base64 = ngx.encode_base64

local str_byte = string.byte
local str_char = string.char
local str_find = string.find
local str_sub = string.sub
local tab_concat = table.concat
local math_floor = math.floor

local _M = {}

local TYPE = "google.api.HttpBody"

-- is field f (of the schema) a singular google.api.HttpBody?
local function is_http_body(f)
    return f ~= nil and f.type == TYPE and not f.repeated and not f.map
end

-- request(data, ct) -> the HttpBody of a raw request body and its
-- Content-Type, as a table in the proto3 JSON mapping
function _M.request(data, ct)
    return {
        content_type = ct ~= "" and ct or nil,
        data = data ~= "" and encode_base64(data) or nil,
    }
end

local function varint_bytes(n)
    local out = ""
    while n >= 128 do
        out = out .. str_char(n % 128 + 128)
        n = math_floor(n / 128)
    end
    return out .. str_char(n)
end

-- encode(data, ct) -> the protobuf bytes of the HttpBody of a raw request
-- body and its Content-Type, for a request that is nothing else | nil,
-- err: the data is copied once, not base64-encoded into JSON text for Go
-- to decode again (at 256 KiB that took the nginx worker about twice the
-- CPU). Go checks nothing on this way, so the check it makes of a proto3
-- string is made here: a server's parser refuses the whole message.
function _M.encode(data, ct)
    if not utf8_valid(ct) then
        return nil, "content_type: invalid UTF-8 in string"
    end
    return tab_concat({
        ct ~= "" and "\10" .. varint_bytes(#ct) .. ct or "",
        data ~= "" and "\18" .. varint_bytes(#data) or "",
        data,
    })
end

-- varint(s, i, n) -> the varint at s[i], the position after it | nil. A
-- double holds every length and tag a message can have exactly.
local function varint(s, i, n)
    local v, mul = 0, 1
    for j = i, i + 9 do
        if j > n then
            return nil
        end
        local b = str_byte(s, j)
        v = v + (b % 128) * mul
        if b < 128 then
            return v, j + 1
        end
        mul = mul * 128
    end
    return nil
end

-- len_fields(s, want) -> { [num] = { piece, ... } } of the length-delimited
-- fields in want ({ [num] = true }) of the message s | nil, err (bytes
-- that are not a message). The other fields are skipped, and so is a
-- field in want with another wire type, which a protobuf parser keeps
-- as an unknown field.
local function len_fields(s, want)
    local out = {}
    local i, n = 1, #s
    while i <= n do
        local tag
        tag, i = varint(s, i, n)
        if not tag or tag < 8 then
            return nil, "cannot parse invalid wire-format data"
        end
        local num, wt = math_floor(tag / 8), tag % 8
        if wt == 0 then
            local _
            _, i = varint(s, i, n)
        elseif wt == 1 then
            i = i + 8
        elseif wt == 5 then
            i = i + 4
        elseif wt == 2 then
            local len
            len, i = varint(s, i, n)
            if len and i + len <= n + 1 and want[num] then
                local list = out[num]
                if not list then
                    list = {}
                    out[num] = list
                end
                list[#list + 1] = str_sub(s, i, i + len - 1)
            end
            i = len and i + len
        else
            i = nil
        end
        if not i or i > n + 1 then
            return nil, "cannot parse invalid wire-format data"
        end
    end
    return out
end

local HTTP_BODY_FIELDS = { [1] = true, [2] = true }

-- answer(route, pb) -> content_type, data | nil, err: the HttpBody of an
-- answer (pb: the response message's bytes), the last of each field
-- given twice, as a protobuf parser keeps it
function _M.answer(route, pb)
    local f = route.resp_field
    if f then
        -- the field's occurrences, merged as a parser merges them
        local fields, err = len_fields(pb, { [f.number] = true })
        if not fields then
            return nil, "bad response: " .. route.output .. ": " .. err
        end
        pb = fields[f.number] and tab_concat(fields[f.number]) or ""
    end
    local fields, err = len_fields(pb, HTTP_BODY_FIELDS)
    if not fields then
        return nil, "bad response: " .. TYPE .. ": " .. err
    end
    local ct = fields[1] and fields[1][#fields[1]] or ""
    local data = fields[2] and fields[2][#fields[2]] or ""
    if str_find(ct, "%c") then
        return nil, "bad response: " .. TYPE .. ": a control character in content_type"
    end
    return ct, data
end

-- bind(route, input, output, body_field): marks a route whose request
-- (raw_in) or answer (raw_out) is an HttpBody
function _M.bind(route, input, output, body_field)
    route.raw_in = (route.body == "*" and input == TYPE) or is_http_body(body_field) or nil
    if route.resp_field then
        route.raw_out = is_http_body(route.resp_field) or nil
    else
        route.raw_out = output == TYPE or nil
    end
    return route
end

return _M
