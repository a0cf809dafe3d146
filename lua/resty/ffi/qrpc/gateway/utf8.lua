-- resty.ffi.qrpc.gateway.utf8: UTF-8 as Go and proto3 define it (no
-- overlong forms, no surrogates, nothing above U+10FFFF), for what the
-- gateway puts into a proto3 string or a JSON text of its own.

local str_byte = string.byte
local str_find = string.find
local str_sub = string.sub
local tab_concat = table.concat

local _M = {}

-- seq(s, i, n) -> the length of the valid sequence at s[i] | nil
local function seq(s, i, n)
    local c = str_byte(s, i)
    if c < 0x80 then
        return 1
    end
    local k, lo, hi
    if c >= 0xC2 and c <= 0xDF then
        k, lo, hi = 1, 0x80, 0xBF
    elseif c == 0xE0 then
        k, lo, hi = 2, 0xA0, 0xBF
    elseif c == 0xED then
        k, lo, hi = 2, 0x80, 0x9F
    elseif c >= 0xE1 and c <= 0xEF then
        k, lo, hi = 2, 0x80, 0xBF
    elseif c == 0xF0 then
        k, lo, hi = 3, 0x90, 0xBF
    elseif c == 0xF4 then
        k, lo, hi = 3, 0x80, 0x8F
    elseif c >= 0xF1 and c <= 0xF3 then
        k, lo, hi = 3, 0x80, 0xBF
    else
        return nil
    end
    if i + k > n then
        return nil
    end
    -- the second byte has the narrower range, the others 80..BF
    local d = str_byte(s, i + 1)
    if d < lo or d > hi then
        return nil
    end
    for j = i + 2, i + k do
        d = str_byte(s, j)
        if d < 0x80 or d > 0xBF then
            return nil
        end
    end
    return k + 1
end

-- valid(s): is s UTF-8?
function _M.valid(s)
    local i = str_find(s, "[\128-\255]")
    if not i then
        return true
    end
    local n = #s
    while i <= n do
        local k = seq(s, i, n)
        if not k then
            return false
        end
        i = i + k
    end
    return true
end

-- clean(s) -> s with every byte that starts no valid sequence replaced
-- by U+FFFD, as Go's encoding/json writes invalid UTF-8
function _M.clean(s)
    local i = str_find(s, "[\128-\255]")
    if not i then
        return s
    end
    local out, no = { str_sub(s, 1, i - 1) }, 1
    local n = #s
    local from = i
    while i <= n do
        local k = seq(s, i, n)
        if k then
            i = i + k
        else
            no = no + 1
            out[no] = str_sub(s, from, i - 1) .. "\239\191\189"
            i = i + 1
            from = i
        end
    end
    out[no + 1] = str_sub(s, from, n)
    return tab_concat(out)
end

return _M
