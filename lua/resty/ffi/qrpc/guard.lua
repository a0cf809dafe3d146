-- resty.ffi.qrpc.guard: reading a caller's nested option tables and
-- lists under pcall, so that a metamethod of theirs that raises (__index,
-- __pairs, __len) becomes "bad argument #N: ... raised an error" instead
-- of an error thrown at the caller, and later checks read plain copies;
-- and the pool's throttle option, read that way.

local abi = require "resty.ffi.qrpc.abi"

local bad = abi.bad
local tostring = abi.show

local type = type
local pairs = pairs
local pcall = pcall
local math_floor = math.floor
local str_format = string.format
local tab_concat = table.concat

local _M = {}


-- A nested options table (health, check) read under pcall: its keys
-- (pairs, or __pairs) and the values of names, so that a metamethod that
-- raises gives "bad argument #2: opts.<what> raised an error" instead of
-- throwing. Returns a plain copy and its unknown key, or nil, err.
function _M.read_nested(t, names, what, argn)
    argn = argn or 2
    local copy, unknown = {}, nil
    local ok, err = pcall(function()
        for k in pairs(t) do
            if not names[k] and unknown == nil then
                unknown = k
            end
        end
        for k in pairs(names) do
            copy[k] = t[k]
        end
    end)
    if not ok then
        return bad(argn, "opts." .. what .. " raised an error: "
                         .. tostring(err))
    end
    if unknown ~= nil then
        return bad(argn, "unknown " .. what .. " option '" .. tostring(unknown)
                         .. "'")
    end
    return copy
end


-- A list of strings read under pcall, as read_nested does for tables.
function _M.read_list(t, what, argn)
    local copy, n = {}, 0
    local ok, err = pcall(function()
        for _ in pairs(t) do
            n = n + 1
        end
        -- read through t[i] (its __index, if any), one past the end
        for i = 1, n + 1 do
            copy[i] = t[i]
        end
    end)
    if not ok then
        if argn == 1 then
            return bad(1, what .. " raised an error: " .. tostring(err))
        end
        return bad(2, "opts." .. what .. " raised an error: " .. tostring(err))
    end
    return copy, n
end



-- throttle = { k = 0 (off) or 1..1e6, codes = { 1..2^32-1, ... } }
-- -> k, codes ("8,14") | nil, err
local throttle_names = { k = true, codes = true }
local MAX_THROTTLE_K, MAX_THROTTLE_CODES = 1e6, 16
function _M.check_throttle(t)
    if t == nil then
        return 0, ""
    end
    if type(t) ~= "table" then
        return bad(2, "throttle must be a table { k = 2, codes = { ... } }")
    end
    local err
    t, err = _M.read_nested(t, throttle_names, "throttle")
    if not t then
        return nil, err
    end
    local k = t.k
    if type(k) ~= "number" or k ~= k or (k ~= 0 and (k < 1 or k > MAX_THROTTLE_K)) then
        return bad(2, "throttle.k must be 0 (off) or a number 1.." .. MAX_THROTTLE_K
                      .. " (got " .. tostring(k) .. ")")
    end
    local codes = ""
    if t.codes ~= nil then
        local list, n = _M.read_list(t.codes, "throttle.codes")
        if not list then
            return nil, n
        end
        if n > MAX_THROTTLE_CODES then
            return bad(2, "throttle.codes: at most " .. MAX_THROTTLE_CODES .. " codes")
        end
        local seen, out = {}, {}
        for i = 1, n do
            local c = list[i]
            if type(c) ~= "number" or not (c >= 1 and c <= 4294967295)
               or math_floor(c) ~= c or seen[c]
            then
                return bad(2, "throttle.codes[" .. i .. "] must be a code 1..4294967295, "
                              .. "each once (got " .. tostring(c) .. ")")
            end
            seen[c] = true
            out[i] = str_format("%d", c)
            list[i] = c
        end
        if n > 0 and k == 0 then
            return bad(2, "throttle.codes needs throttle.k")
        end
        codes = tab_concat(out, ",")
        return k, codes, list
    end
    return k, codes
end


return _M
