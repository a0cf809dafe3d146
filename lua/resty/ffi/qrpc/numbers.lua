-- resty.ffi.qrpc.numbers: the words for a number an option refuses,
-- one vocabulary for connect's, unary's and the pools' options: the type
-- it got, NaN or an infinity, or the bound it passes, with the value.

local abi = require "resty.ffi.qrpc.abi"

local bad = abi.bad
local tostring = abi.show

local type = type
local math_huge = math.huge
local math_ceil = math.ceil
local MAX_MS = require("resty.ffi.qrpc.limits").MS

local _M = {}


-- The word for a number no option takes (NaN, inf, -inf), or nil.
local function odd_number(v)
    if v ~= v then
        return "NaN"
    end
    if v == math_huge then
        return "inf"
    end
    if v == -math_huge then
        return "-inf"
    end
end
_M.odd_number = odd_number


-- not_ms(argn, name, v) -> nil, the words when v is no number, NaN or an
-- infinity; false for a finite number.
local function not_ms(argn, name, v)
    if type(v) ~= "number" then
        return bad(argn, name .. " must be a number of milliseconds (got "
                         .. type(v) .. ")")
    end
    local odd = odd_number(v)
    if odd then
        return bad(argn, name .. " must be a number of milliseconds, not " .. odd)
    end
    return false
end


-- check_ms(v, argn, name): a time in ms (0..MAX_MS), rounded up to an
-- integer; or nil, err.
function _M.check_ms(v, argn, name)
    local no, err = not_ms(argn, name, v)
    if no == nil then
        return nil, err
    end
    if v < 0 or v > MAX_MS then
        return bad(argn, name .. " must be 0.." .. MAX_MS .. " ms (got "
                         .. tostring(v) .. ")")
    end
    return math_ceil(v)
end


-- ms_bad(argn, name, v, least): why is_ms refused v (or, least "> 0",
-- refused 0): the type, NaN or an infinity, past the top, or below the
-- least, each with what it got.
function _M.ms_bad(argn, name, v, least)
    local no, err = not_ms(argn, name, v)
    if no == nil then
        return nil, err
    end
    if v > MAX_MS then
        return bad(argn, name .. " must be at most " .. MAX_MS .. " ms (got "
                         .. tostring(v) .. ")")
    end
    return bad(argn, name .. " must be a number of milliseconds "
                     .. (least or ">= 0") .. " (got " .. tostring(v) .. ")")
end


-- count_bad(argn, name, v, lo, hi): why v is not an integer lo..hi.
function _M.count_bad(argn, name, v, lo, hi)
    if type(v) == "number" then
        local odd = odd_number(v)
        if odd then
            return bad(argn, name .. " must be a number, not " .. odd)
        end
    end
    return bad(argn, name .. " must be an integer " .. lo .. ".." .. hi
                     .. " (got " .. (type(v) == "number" and tostring(v) or type(v))
                     .. ")")
end


return _M
