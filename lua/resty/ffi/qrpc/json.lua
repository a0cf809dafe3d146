-- resty.ffi.qrpc.json: Lua tables <-> JSON text for the HTTP side of
-- resty.ffi.qrpc.gateway (request bodies, answers, error bodies, the
-- OpenAPI document), in the proto3 JSON mapping's spellings.
--
-- encode(v) -> json | nil, err
--   Written here rather than by cjson: lua-cjson writes numbers with at
--   most 14 significant digits (OpenResty's fork 16), which changes doubles
--   and integers above 10^14; this writes integers exactly and other
--   numbers with the shortest form that reads back to the same double.
--   Tables: 1..n without holes -> array, else object (keys must be
--   strings, integers or 64-bit integer cdata: map<int32, ...> and
--   map<int64, ...> keys); an empty table is {}
--   unless it carries cjson's array metatable or is _M.empty_array;
--   cjson.null / ngx.null -> null; NaN and +-inf -> "NaN", "Infinity",
--   "-Infinity" (protojson's spellings); int64_t / uint64_t cdata (1LL,
--   2ULL) -> their digits as a string.
-- decode(json) -> value | nil, err
--   cjson.decode when lua-cjson is installed (OpenResty bundles it;
--   Debian: package lua-cjson), else a decoder of its own. JSON null ->
--   ngx.null (cjson.null is the same light userdata).

local ngx = ngx
local null = ngx.null
local type = type
local pairs = pairs
local next = next
local tostring = tostring
local tonumber = tonumber
local getmetatable = getmetatable
local setmetatable = setmetatable
local pcall = pcall
local math_floor = math.floor
local math_huge = math.huge
local str_format = string.format
local str_byte = string.byte
local str_char = string.char
local str_find = string.find
local str_gsub = string.gsub
local str_sub = string.sub
local tab_concat = table.concat

local ok_cjson, cjson = pcall(require, "cjson.safe")
if not ok_cjson then
    cjson = nil
end

local _M = {
    _VERSION = "0.1.0",
    has_cjson = cjson ~= nil,
}

-- An empty list: plain {} is written as an object.
local array_mt = {}
_M.array_mt = array_mt
_M.empty_array = setmetatable({}, array_mt)
local cjson_array_mts = {}
if cjson then
    if cjson.array_mt then
        cjson_array_mts[cjson.array_mt] = true
    end
    if cjson.empty_array_mt then
        cjson_array_mts[cjson.empty_array_mt] = true
    end
end
local cjson_empty_array = cjson and cjson.empty_array
-- Every metatable that marks an array, as a list (string.buffer's
-- encoder option: proto.lua sends request tables in that format).
_M.array_mts = { array_mt }
for mt in pairs(cjson_array_mts) do
    _M.array_mts[#_M.array_mts + 1] = mt
end

local MAX_DEPTH = 100

local escapes = {
    ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
    ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t',
}
local function escape_char(c)
    return escapes[c] or str_format("\\u%04x", str_byte(c))
end

-- The output goes into a string.buffer: no intermediate strings are
-- made for quotes and separators.
local out_buf = require("string.buffer").new(512)

-- Whether s needs no escaping. string.find with a pattern is not compiled
-- by LuaJIT (each call ends the trace and goes through the interpreter);
-- libc's strcspn through the FFI is a plain call inside the trace. A NUL
-- byte stops strcspn early, which only sends s to the slow path below.
local ESCAPED = '"\\' .. str_char(127)
for c = 1, 31 do
    ESCAPED = ESCAPED .. str_char(c)
end
local ffi = require "ffi"
local plain_string
do
    -- under a name of our own (another module may declare strcspn);
    -- int: strings are shorter than 2^31 bytes
    pcall(ffi.cdef, "int qrpc_json_strcspn(const char *s, const char *reject) "
                    .. "__asm__(\"strcspn\");")
    local ok_sym, strcspn = pcall(function() return ffi.C.qrpc_json_strcspn end)
    if ok_sym then
        plain_string = function(s)
            return strcspn(s, ESCAPED) == #s
        end
    else
        plain_string = function(s)
            return not str_find(s, '[%c"\\]')
        end
    end
end

local function put_string(b, s)
    if not plain_string(s) then
        s = str_gsub(s, '[%c"\\]', escape_char)
    end
    b:put('"', s, '"')
end

-- Object keys are mostly the same few field names on every call: their
-- '"name":' text is kept (short keys only, and at most MAX_KEYS of them, so
-- that map keys from requests cannot grow it without bound).
local MAX_KEYS = 2048
local MAX_KEY_LEN = 64
local key_texts = {}
local nkey_texts = 0

local function key_text(k)
    local kt = key_texts[k]
    if kt then
        return kt
    end
    if plain_string(k) then
        kt = '"' .. k .. '":'
    else
        kt = '"' .. str_gsub(k, '[%c"\\]', escape_char) .. '":'
    end
    if #k <= MAX_KEY_LEN then
        if nkey_texts >= MAX_KEYS then
            key_texts = {}
            nkey_texts = 0
        end
        nkey_texts = nkey_texts + 1
        key_texts[k] = kt
    end
    return kt
end

-- Set while encode_body runs (nothing yields in an encode): ±inf is the
-- number 1e999, not the string "Infinity".
local inf_literal = false

local function put_number(b, n)
    if n ~= n then
        b:put('"NaN"')
    elseif n == math_huge then
        b:put(inf_literal and "1e999" or '"Infinity"')
    elseif n == -math_huge then
        b:put(inf_literal and "-1e999" or '"-Infinity"')
    elseif math_floor(n) == n and n > -1e14 and n < 1e14 then
        b:put(tostring(n))              -- %.14g: exact for these integers
    elseif math_floor(n) == n and n > -1e15 and n < 1e15 then
        b:put(str_format("%d", n))
    elseif math_floor(n) == n and n > -2^64 and n < 2^64 then
        -- every digit of the integer the double holds (2^60 is
        -- 1152921504606846976, not 1152921504606847000, which a 64-bit
        -- field reads as another integer), as Go's luaserial writes it
        b:put(str_format("%.0f", n))
    else
        -- the shortest of 15 and 17 digits that reads back the same double
        local s = str_format("%.15g", n)
        if tonumber(s) ~= n then
            s = str_format("%.17g", n)
        end
        b:put(s)
    end
end

-- LuaJIT's 64-bit integers (1LL, 2ULL) are written exactly, as strings.
local is_int64
do
    local istype = ffi.istype
    local int64_t, uint64_t = ffi.typeof("int64_t"), ffi.typeof("uint64_t")
    is_int64 = function(v)
        return istype(int64_t, v) or istype(uint64_t, v)
    end
end

-- The digits of tostring(1LL) / tostring(1ULL), without the suffix.
local function int64_digits(v)
    local s = tostring(v)
    return str_sub(s, 1, str_byte(s, -3) == 85 and -4 or -3)   -- 85: "U"
end

local put_value

local function put_table(b, t, depth)
    if depth > MAX_DEPTH then
        return nil, "nested too deep (more than " .. MAX_DEPTH .. " levels, or a cycle)"
    end
    if next(t) == nil then
        local mt = getmetatable(t)
        if mt == array_mt or cjson_array_mts[mt] or t == cjson_empty_array then
            b:put("[]")
        else
            b:put("{}")
        end
        return true
    end
    local ok, err
    local len = #t
    local count = 0
    if len > 0 then
        -- a list only if 1..len are all its keys
        for _ in pairs(t) do
            count = count + 1
        end
    end
    if len > 0 and count == len then
        b:put("[")
        for i = 1, len do
            if i > 1 then
                b:put(",")
            end
            ok, err = put_value(b, t[i], depth + 1)
            if not ok then
                return nil, err
            end
        end
        b:put("]")
        return true
    end
    b:put("{")
    local first = true
    for k, v in pairs(t) do
        local tk = type(k)
        if not first then
            b:put(",")
        end
        first = false
        if tk == "string" then
            b:put(key_text(k))
        elseif tk == "number" and math_floor(k) == k and k > -1e15 and k < 1e15 then
            b:put('"', str_format("%d", k), '":')
        elseif tk == "cdata" and is_int64(k) then
            -- a map<int64, ...> key, every digit (as Go's luaserial writes it)
            b:put('"', int64_digits(k), '":')
        else
            return nil, "table keys must be strings or integers (got "
                        .. (tk == "number" and tostring(k) or tk) .. ")"
        end
        ok, err = put_value(b, v, depth + 1)
        if not ok then
            return nil, err
        end
    end
    b:put("}")
    return true
end

put_value = function(b, v, depth)
    local tv = type(v)
    if tv == "string" then
        put_string(b, v)
    elseif tv == "number" then
        put_number(b, v)
    elseif tv == "table" then
        return put_table(b, v, depth)
    elseif tv == "boolean" then
        b:put(v and "true" or "false")
    elseif v == null then
        b:put("null")
    elseif tv == "cdata" and is_int64(v) then
        -- as a JSON string: the proto3 JSON form of a 64-bit integer
        b:put('"', int64_digits(v), '"')
    else
        return nil, "cannot encode a " .. tv .. " value"
    end
    return true
end


function _M.encode(v)
    local ok, err = put_value(out_buf, v, 0)
    if not ok then
        out_buf:reset()
        return nil, err
    end
    return out_buf:get()
end


-- encode_body(v): encode(v) for a JSON body decoded and merged again (the
-- gateway's): an infinity in it came from a number past a double's range
-- (1e999), and goes out as such a number, which Go refuses for a field it
-- knows (as it does in a body read whole) and drops with an unknown one
-- under discard_unknown; "Infinity" would be a valid double.
function _M.encode_body(v)
    inf_literal = true
    local ok, text, err = pcall(_M.encode, v)
    inf_literal = false
    if not ok then
        return nil, text
    end
    return text, err
end


-------------------------------------------------------------------------
-- Decoding
-------------------------------------------------------------------------

local cjson_decode
if cjson then
    -- A private instance: the user's cjson settings stay theirs.
    local inst = cjson.new and cjson.new() or cjson
    if inst.decode_max_depth then
        inst.decode_max_depth(MAX_DEPTH)
    end
    cjson_decode = inst.decode
end

-- The decoder used without cjson: plain recursive descent over the text
-- protojson writes (and any other valid JSON).
local decode_value

local function skip_ws(s, i)
    local _, e = str_find(s, "^[ \t\r\n]*", i)
    return e + 1
end

local function utf8_char(cp)
    if cp < 0x80 then
        return str_char(cp)
    elseif cp < 0x800 then
        return str_char(0xC0 + math_floor(cp / 64), 0x80 + cp % 64)
    elseif cp < 0x10000 then
        return str_char(0xE0 + math_floor(cp / 4096),
                        0x80 + math_floor(cp / 64) % 64, 0x80 + cp % 64)
    end
    return str_char(0xF0 + math_floor(cp / 262144),
                    0x80 + math_floor(cp / 4096) % 64,
                    0x80 + math_floor(cp / 64) % 64, 0x80 + cp % 64)
end

local unescape_map = {
    ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f',
    n = '\n', r = '\r', t = '\t',
}

local function decode_string(s, i)
    -- i is at the opening quote
    local j = i + 1
    local parts, np = nil, 0
    while true do
        local a, b = str_find(s, '["\\]', j)
        if not a then
            return nil, "unterminated string at " .. i
        end
        local c = str_sub(s, a, b)
        if c == '"' then
            local chunk = str_sub(s, j, a - 1)
            if not parts then
                return chunk, a + 1
            end
            np = np + 1
            parts[np] = chunk
            return tab_concat(parts, "", 1, np), a + 1
        end
        parts = parts or {}
        np = np + 1
        parts[np] = str_sub(s, j, a - 1)
        local e = str_sub(s, a + 1, a + 1)
        if e == "u" then
            local hex = str_sub(s, a + 2, a + 5)
            local cp = str_find(hex, "^%x%x%x%x$") and tonumber(hex, 16)
            if not cp then
                return nil, "bad \\u escape at " .. a
            end
            j = a + 6
            if cp >= 0xD800 and cp < 0xDC00 and str_sub(s, j, j + 1) == "\\u" then
                local lhex = str_sub(s, j + 2, j + 5)
                local lo = str_find(lhex, "^%x%x%x%x$") and tonumber(lhex, 16)
                if lo and lo >= 0xDC00 and lo < 0xE000 then
                    cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
                    j = j + 6
                end
            end
            np = np + 1
            parts[np] = utf8_char(cp)
        else
            local r = unescape_map[e]
            if not r then
                return nil, "bad escape at " .. a
            end
            np = np + 1
            parts[np] = r
            j = a + 2
        end
    end
end

decode_value = function(s, i, depth)
    if depth > MAX_DEPTH then
        return nil, "nested too deep"
    end
    i = skip_ws(s, i)
    local c = str_sub(s, i, i)
    if c == "{" then
        local t = {}
        i = skip_ws(s, i + 1)
        if str_sub(s, i, i) == "}" then
            return t, i + 1
        end
        while true do
            if str_sub(s, i, i) ~= '"' then
                return nil, "expected a key at " .. i
            end
            local k, err = decode_string(s, i)
            if not k then
                return nil, err
            end
            i = skip_ws(s, err)
            if str_sub(s, i, i) ~= ":" then
                return nil, "expected ':' at " .. i
            end
            local v
            v, i = decode_value(s, i + 1, depth + 1)
            if v == nil then
                return nil, i
            end
            t[k] = v
            i = skip_ws(s, i)
            c = str_sub(s, i, i)
            if c == "}" then
                return t, i + 1
            end
            if c ~= "," then
                return nil, "expected ',' or '}' at " .. i
            end
            i = skip_ws(s, i + 1)
        end
    elseif c == "[" then
        local t, n = {}, 0
        i = skip_ws(s, i + 1)
        if str_sub(s, i, i) == "]" then
            return setmetatable(t, array_mt), i + 1
        end
        while true do
            local v
            v, i = decode_value(s, i, depth + 1)
            if v == nil then
                return nil, i
            end
            n = n + 1
            t[n] = v
            i = skip_ws(s, i)
            c = str_sub(s, i, i)
            if c == "]" then
                return t, i + 1
            end
            if c ~= "," then
                return nil, "expected ',' or ']' at " .. i
            end
            i = i + 1
        end
    elseif c == '"' then
        return decode_string(s, i)
    elseif c == "t" and str_sub(s, i, i + 3) == "true" then
        return true, i + 4
    elseif c == "f" and str_sub(s, i, i + 4) == "false" then
        return false, i + 5
    elseif c == "n" and str_sub(s, i, i + 3) == "null" then
        return null, i + 4
    end
    local a, b = str_find(s, "^-?%d+%.?%d*[eE]?[-+]?%d*", i)
    if not a then
        return nil, "unexpected character at " .. i
    end
    local v = tonumber(str_sub(s, a, b))
    if not v then
        return nil, "bad number at " .. i
    end
    return v, b + 1
end


-- decode_lua is the decoder used without cjson (public for its tests).
local function decode_lua(s)
    if type(s) ~= "string" then
        return nil, "JSON must be a string"
    end
    local v, i = decode_value(s, 1, 0)
    if v == nil then
        return nil, i
    end
    if skip_ws(s, i) <= #s then
        return nil, "trailing characters at " .. i
    end
    return v
end
_M.decode_lua = decode_lua



function _M.decode(s)
    if not cjson_decode then
        return decode_lua(s)
    end
    if type(s) ~= "string" then
        return nil, "JSON must be a string"
    end
    local v, err = cjson_decode(s)
    if v == nil then
        return nil, err
    end
    return v
end


return _M
